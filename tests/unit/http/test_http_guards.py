"""The endpoint's edge checks as pure functions: Host names, numbers, cursors."""
from __future__ import annotations

import pytest

from memprof_otel.http.guards import (accepts_gzip, host_allowed, host_name, json_number, media_type, parse_cursor,
                                     parse_integer, parse_number)


@pytest.mark.parametrize("header,name", [
    ("127.0.0.1:9464", "127.0.0.1"), ("LocalHost", "localhost"), ("[::1]:80", "::1"), ("example.com.", "example.com"),
    ("a:b", None), ("[::1", None), ("[::1]x", None), ("", None), ("x:", None), ("x:1234567", None),
])
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("header,bind,allowed,ok", [
    ("localhost:9464", "127.0.0.1", (), True), ("127.0.0.5", "127.0.0.1", (), True), ("[::1]", "::1", (), True),
    ("evil.example", "127.0.0.1", (), False), ("evil.example:9464", "0.0.0.0", (), False),
    ("10.0.0.7:9464", "0.0.0.0", (), True), ("10.0.0.7", "127.0.0.1", (), False), ("10.0.0.7", "10.0.0.7", (), True),
    ("myhost:1", "myhost", (), True), ("app:9464", "0.0.0.0", ("app",), True), ("x.example", "127.0.0.1", ("*",), True),
    ("10.0.0.8", "127.0.0.1", ("10.0.0.8",), True), ("192.168.1.2", None, (), True), ("svc.local", None, (), False),
    (None, "127.0.0.1", (), True), ("127.0.0.1,evil.example", "127.0.0.1", (), False),
])
def test_host_allowed(header, bind, allowed, ok):
    assert host_allowed(header, bind, allowed) is ok


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "", " 1", "1_0", "0x1", "\uff11",
                                 "1" * 40, "-1", "11"])
def test_parse_number_refuses_non_finite_junk_and_out_of_range(raw):
    assert parse_number(raw, 0.0, 10.0) is None


def test_parse_number_and_integer_accept_plain_decimals():
    assert parse_number("2.5", 0, 10) == 2.5 and parse_number("1e1", 0, 10) == 10.0 and parse_number(".5", 0, 1) == 0.5
    assert parse_integer("7", 1, 10) == 7 and parse_integer("+7", 1, 10) == 7
    assert parse_integer("7.0", 1, 10) is None and parse_integer("1e1", 1, 10) is None
    assert parse_integer("9" * 19, 1, 10) is None and parse_integer("0", 1, 10) is None


def test_cursor_round_trip_and_refusals():
    assert parse_cursor("1712345678.25_42") == (1712345678.25, 42)
    for bad in ("", "1", "nan_1", "inf_1", "1_-1", "1_1.5", "1_2_3", "1e999_1", "_", "1_"):
        assert parse_cursor(bad) is None, bad


def test_media_type():
    assert media_type("Application/JSON; charset=utf-8") == "application/json"
    assert media_type("") == ""


@pytest.mark.parametrize("header, expected", [
    ("gzip", True), ("deflate, gzip;q=0.5", True), ("x-gzip", True), ("*", True), ("GZIP", True),
    ("gzip;q=0", False), ("gzip;q=0.0, identity", False), ("*;q=0", False), ("identity", False), ("", False),
    ("*, gzip;q=0", False), ("gzip;q=junk", False), ("br;q=1, gzip ; q=0.001", True)])
def test_accepts_gzip_honours_q_values(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


@pytest.mark.parametrize("value", [True, False, None, "5", [5], {"v": 5}, float("nan"), float("inf"), -float("inf"),
                                   0, 11, 10**400, 0.5])
def test_json_number_refuses_wrong_types_non_finite_and_out_of_range(value):
    assert json_number(value, 1, 10) is None


def test_json_number_takes_in_range_numbers_and_integers_only_where_asked():
    assert json_number(1, 1, 10) == 1 and json_number(10.0, 1, 10) == 10.0 and json_number(2.5, 1, 10) == 2.5
    assert json_number(3, 1, 10, integer=True) == 3
    assert json_number(3.0, 1, 10, integer=True) is None and json_number(True, 0, 10, integer=True) is None
