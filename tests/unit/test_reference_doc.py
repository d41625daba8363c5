"""docs/reference.md, the user reference, against the code: every configuration key with its
default, and every CLI command; and the route table's layout: one line a route, the detail in the
sections its row links to. (Metrics: tests/unit/test_metric_names.py; routes:
tests/integration/test_http_endpoint.py.)"""
from __future__ import annotations

import re
import tempfile

import pytest
import yaml

import memprof_otel as mp
from memprof_otel.cli import COMMANDS
from tests import reference_doc


def _code_keys() -> set[str]:
    keys = set()
    for name, value in mp.Config().to_dict().items():
        if isinstance(value, dict):
            keys.update(f"{name}.{k}" for k in value)
        else:
            keys.add(name)
    return keys


def test_configuration_table_lists_exactly_the_config_keys():
    documented = set(reference_doc.documented_config())
    assert len(documented) >= 25  # a guard on the parser
    assert documented == _code_keys(), (
        f"only in docs/reference.md: {sorted(documented - _code_keys())}; "
        f"only in the code: {sorted(_code_keys() - documented)}")


@pytest.mark.parametrize("key", sorted(reference_doc.documented_config()))
def test_documented_default_is_the_default(key: str):
    written = reference_doc.first_code(reference_doc.documented_config()[key])
    written = written.replace("<temp dir>", tempfile.gettempdir())  # platform-dependent, described
    if "<" in written:
        pytest.skip(f"{key}: default described as {written!r}")
    section, _, field = key.partition(".")
    value = yaml.safe_load(written)
    layer = {section: {field: value}} if field else {section: value}
    documented = mp.load_config(layer, environ={})
    default = mp.load_config(None, environ={})
    pick = (lambda c: getattr(getattr(c, section), field)) if field else (lambda c: getattr(c, section))
    assert pick(documented) == pick(default), (key, written, pick(default))


def test_cli_table_lists_exactly_the_commands():
    assert reference_doc.documented_commands() == set(COMMANDS)


# ---- the route table: one line a route, the rest in the sections it links to ------------------

ROUTE_CELL_MAX = 250  # characters: a table cell longer than this is a paragraph, unreadable as a row


def test_route_table_cells_are_one_line_each():
    rows = reference_doc.table_rows(reference_doc.section("HTTP endpoint"))
    assert len(rows) >= 15  # a guard on the parser
    long = [cells[0] for cells in rows if max(map(len, cells)) > ROUTE_CELL_MAX]
    assert not long, f"route rows over {ROUTE_CELL_MAX} characters (move the detail into its section): {long}"


def test_route_details_are_linked_from_their_rows_and_exist():
    links, details = reference_doc.route_table_links(), reference_doc.route_details()
    assert len(details) >= 10  # a guard on the parser
    anchors = {reference_doc.heading_anchor(h): h for h in reference_doc.headings()}
    assert set(details) <= set(links), f"detail sections of routes the table lacks: {sorted(set(details) - set(links))}"
    for route, body in details.items():
        assert body, f"{route}: empty detail section"
        own = reference_doc.heading_anchor(f"`{route[0]} {route[1]}`")
        assert own in links[route], f"{route}: its row does not link to its section (#{own})"
    for route, targets in links.items():
        for target in targets:
            assert target in anchors, f"{route}: the link #{target} names no heading of docs/reference.md"


def test_heading_anchor_is_the_renderers():
    assert reference_doc.heading_anchor("`GET /v1/dumps/{id}`") == "get-v1dumpsid"
    assert reference_doc.heading_anchor("Who can reach the endpoint") == "who-can-reach-the-endpoint"
    assert reference_doc.heading_anchor("pprof files") == "pprof-files"


# ---- the CLI: every option of every subcommand's parser, and nothing else ---------------------

def _parser_options() -> dict[str, set[str]]:
    from memprof_otel.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]  # argparse keeps its subparsers here
    return {name: {o for a in p._actions for o in a.option_strings} - {"-h", "--help"}
            for name, p in sub.choices.items()}


def test_cli_table_names_every_option_of_every_command_and_no_other():
    documented, code = reference_doc.documented_command_options(), _parser_options()
    assert set(documented) == set(code)
    for command, options in code.items():
        # each option by its long form; `-o FILE` stands for `--output` where the parser has both
        missing = {o for o in options if o.startswith("--") and o not in documented[command]
                   and not (o == "--output" and "-o" in documented[command])}
        assert not missing, f"{command}: options missing from docs/reference.md's CLI table: {sorted(missing)}"
        extra = documented[command] - options
        assert not extra, f"{command}: documented options the parser does not have: {sorted(extra)}"


def test_readme_cli_section_names_every_command():
    body = reference_doc.section("CLI", reference_doc.readme())
    assert {c for c in COMMANDS if f"`{c}" in body or f"`memprof-otel {c}" in body} == set(COMMANDS)


# ---- the Python API block: signatures as the code has them ------------------------------------

def _signature_params(fn) -> list[str]:
    import inspect

    out, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(("**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else "") + p.name)
        star = star or p.kind is p.VAR_POSITIONAL
    return out


def _documented_names(params: tuple[str, ...]) -> list[str]:
    return [p.split("=", 1)[0].strip() for p in params]


def _target(owner: str, name: str):
    obj = getattr(mp if owner == "mp" else mp.Instrumentation, name)
    return obj.__init__ if isinstance(obj, type) else obj


def test_every_public_function_is_in_the_api_block():
    import inspect

    documented = {name for owner, name in reference_doc.documented_api() if owner == "mp"}
    public = {n for n in mp.__all__ if inspect.isfunction(getattr(mp, n)) or n == "operation"}
    assert public - documented == set(), "public functions missing from docs/reference.md's Python API block"


@pytest.mark.parametrize("key", sorted(reference_doc.documented_api()), ids=lambda k: f"{k[0]}.{k[1]}")
def test_api_block_signature_is_the_codes(key):
    import inspect

    line = reference_doc.documented_api()[key]
    fn = _target(*key)
    # the parameters, in order, with the same names (keyword-only after a bare *)
    assert _documented_names(line.params) == _signature_params(fn), line
    # a default written is the default
    sig = inspect.signature(fn)
    for written in line.params:
        if "=" in written:
            pname, value = (x.strip() for x in written.split("=", 1))
            assert repr(sig.parameters[pname].default) == value, (line, pname)
    # what it returns: written when it returns something, and the same name
    # (compared by the first name: `_http.Server` is `Server`, `Callable[..., Any]` is `Callable`)
    ret = sig.return_annotation
    first = lambda t: re.match(r"(?:\w+\.)*(\w+)", str(t)).group(1)  # noqa: E731
    ret_name = None if ret in (None, "None", inspect.Signature.empty) else first(ret)
    assert (line.returns and first(line.returns)) == ret_name, (line, ret)


# ---- the errors: every typed error, in both lists ---------------------------------------------

def _exported_errors() -> set[str]:
    return {n for n in mp.__all__ if isinstance(getattr(mp, n), type) and issubclass(getattr(mp, n), mp.MemprofError)}


def test_error_lists_name_every_exported_error():
    readme = reference_doc.documented_errors(reference_doc.section("Errors", reference_doc.readme()))
    reference = reference_doc.section("Python API")
    paragraph = reference[reference.index("Errors are typed"):].split("\n\n", 1)[0]
    assert _exported_errors() == readme & _exported_errors() == reference_doc.documented_errors(paragraph) & _exported_errors()
    assert len(_exported_errors()) >= 13


# ---- the README's route list is the OpenAPI document's --------------------------------------

def test_readme_route_list_is_the_openapi_documents():
    import re

    from memprof_otel.http.openapi import openapi_document

    body = reference_doc.section("Scrape it with Prometheus", reference_doc.readme())
    routes = body[body.index("Routes:"):].split("\n\n", 1)[0]
    written = {re.sub(r"\?.*", "", p) for p in re.findall(r"`(?:(?:GET|PUT|POST)(?:\|(?:GET|PUT|POST))* )?(/[^`\s]*)`", routes)}
    expanded = set()
    for p in written:  # `GET /v1/dumps[/{id}]` is two paths
        expanded |= {p.replace("[/{id}]", ""), p.replace("[", "").replace("]", "")} if "[" in p else {p}
    assert expanded == set(openapi_document()["paths"])
