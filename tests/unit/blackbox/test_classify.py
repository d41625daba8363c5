"""Why a process ended, from its record and what the kernel says now; each reason names the
evidence that decided it."""
from __future__ import annotations

from memprof_otel.blackbox.classify import KernelView, classify, ended_unix
from memprof_otel.blackbox.format import Contents, Layout


def _c(state=None, flight=(), samples=()):
    return Contents(Layout(4), {"pid": 9}, dict(state or {}), list(flight), list(samples))


FLIGHT = {"model": "m", "started_unix": 100.0, "limit_reached": True}  # marked by the notification


def test_nothing_but_the_end_is_a_kill():
    assert classify(_c(), KernelView()) == ("killed", ["no_exit_path"])


def test_an_exit_that_began_without_a_clean_end_is_exited():
    assert classify(_c({"exiting": True}), KernelView()) == ("exited", ["exit_started"])


def test_the_cgroup_counter_decides_only_when_it_rose_past_the_last_tick():
    samples = [{"t": 1.0, "oom_kills": 2}]
    assert classify(_c(samples=samples), KernelView(oom_kills_now=2)) == ("killed", ["no_exit_path"])
    assert classify(_c(samples=samples), KernelView(oom_kills_now=3)) == ("oom_kill", ["oom_kill_counter"])
    assert classify(_c(), KernelView(oom_kills_now=3))[0] == "killed"  # no count recorded to compare


def test_the_limit_reached_during_a_forward_still_in_flight_is_an_oom_kill():
    above = {"near_limit": {"t": 101.0, "above": True}}
    assert classify(_c(above, [FLIGHT]), KernelView()) == ("oom_kill", ["limit_reached"])
    # crossed before the forward in flight began: the notification did not mark it
    unmarked = {**FLIGHT, "limit_reached": False}
    assert classify(_c({"near_limit": {"t": 99.0, "above": True}}, [unmarked]), KernelView())[0] == "killed"
    # fell back under the threshold since
    assert classify(_c({"near_limit": {"t": 101.0, "above": False}}, [FLIGHT]), KernelView())[0] == "killed"
    # nothing in flight
    assert classify(_c(above), KernelView())[0] == "killed"


def test_evidence_is_listed_strongest_first_and_beats_an_exit():
    c = _c({"exiting": True, "oom_event": {"t": 101.0}, "near_limit": {"t": 101.0, "above": True}}, [FLIGHT],
           [{"t": 1.0, "oom_kills": 0}])
    assert classify(c, KernelView(oom_kills_now=1, kernel_log_kill=True)) == (
        "oom_kill", ["kernel_log", "oom_kill_counter", "oom_event", "limit_reached"])
    assert classify(c, KernelView(kernel_log_kill=False)) == ("oom_kill", ["oom_event", "limit_reached"])


def test_the_end_is_the_last_moment_the_record_shows():
    c = _c({"near_limit": {"t": 105.5, "above": True}}, [FLIGHT], [{"t": 104.0}, {"t": 105.0}])
    assert ended_unix(c) == 105.5
    assert ended_unix(_c()) is None


SIGTERM_NOTED = {"stop_signal": {"signum": 15, "name": "SIGTERM", "t": 50.0}}


SHUTDOWN_DONE = {"stop_signal": {**SIGTERM_NOTED["stop_signal"], "shutdown_done_unix": 52.0}}


def test_a_handled_stop_signal_whose_shutdown_ended_with_nothing_in_flight_is_a_graceful_stop():
    assert classify(_c(SHUTDOWN_DONE), KernelView()) == ("stopped", ["stop_signal_handled", "shutdown_done"])
    # handled, but the shutdown never ended (a handler that only logs, then a SIGKILL while idle)
    assert classify(_c(SIGTERM_NOTED), KernelView()) == ("killed", ["no_exit_path", "after_stop_signal"])
    # a forward still in flight when it died: the graceful stop was cut short (a grace period ran out)
    assert classify(_c(SHUTDOWN_DONE, [{**FLIGHT, "limit_reached": False}]), KernelView()) == \
        ("killed", ["no_exit_path", "after_stop_signal"])
    # the OOM killer's evidence comes first, whatever was handled before
    assert classify(_c(SHUTDOWN_DONE), KernelView(kernel_log_kill=True)) == ("oom_kill", ["kernel_log"])
    # an exit that began after the signal and never finished is still ``exited``
    assert classify(_c({**SIGTERM_NOTED, "exiting": True}), KernelView()) == ("exited", ["exit_started"])


def test_an_unnamed_services_key_is_its_whole_command_line_and_working_directory():
    from memprof_otel.blackbox.service import service_key
    a = ["/venv/lib/uvicorn/__main__.py", "app:app", "--port=8001"]
    assert service_key("memprof-otel", a, "/srv") == service_key("memprof-otel", list(a), "/srv")  # a restart
    assert service_key("memprof-otel", a[:2] + ["--port=8002"], "/srv") != service_key("memprof-otel", a, "/srv")
    assert service_key("memprof-otel", ["/venv/lib/gunicorn/__main__.py", *a[1:]], "/srv") != \
        service_key("memprof-otel", a, "/srv")
    assert service_key("memprof-otel", a, "/other") != service_key("memprof-otel", a, "/srv")
    assert service_key("embedder", a, "/srv") == "embedder"  # a named service is its name
