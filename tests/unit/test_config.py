import pytest

from memprof_otel import ConfigError, load_config
from memprof_otel.config import service_name_in_effect
from memprof_otel.units import format_bytes, parse_bytes, parse_duration


@pytest.mark.parametrize("text,expected", [("20GiB", 20 * 1024**3), ("512MB", 512 * 10**6), ("1e3", 1000),
                                           (4096, 4096), ("1.5KiB", 1536), ("7", 7)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["20 GiBs", "", "-1", True, None, [1], "GiB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


@pytest.mark.parametrize("text,expected", [("500ms", 0.5), ("2m", 120.0), (3, 3.0), ("10s", 10.0), ("1h", 3600.0)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


def test_format_bytes():
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(-2 * 1024**3) == "-2.0 GiB" and format_bytes(12) == "12 B"


def test_precedence_file_env_kwargs(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("sampler:\n  interval: 2s\nattribution:\n  every_n_forwards: 3\n  max_depth: 2\n")
    env = {"MEMPROF_OTEL_ATTRIBUTION_EVERY_N_FORWARDS": "5", "MEMPROF_OTEL_SERVICE_NAME": "svc"}
    cfg = load_config(f, environ=env, max_depth=4)
    assert cfg.sampler.interval == 2.0
    assert cfg.attribution.every_n_forwards == 5  # env beats file
    assert cfg.attribution.max_depth == 4         # kwargs beat file
    assert cfg.service_name == "svc"
    cfg = load_config(f, environ=env, attribution={"every_n_forwards": 9})
    assert cfg.attribution.every_n_forwards == 9  # kwargs beat env


@pytest.mark.parametrize("layer,key", [
    ({"attribution": {"every_n_forwards": 0}}, "attribution.every_n_forwards"),
    ({"attribution": {"overhead_budget": "lots"}}, "attribution.overhead_budget"),
    ({"attribution": {"nope": 1}}, "attribution.nope"),
    ({"nope": {}}, "nope"),
    ({"sampler": {"interval": "1ms"}}, "sampler.interval"),
    ({"http": {"port": 70000}}, "http.port"),
    ({"sampler": 5}, "sampler"),
    ({"watchdog": {"rules": [{"name": "x", "metric": "memprof_a", "op": "=>", "threshold": 1}]}},
     "watchdog.rules[0].op"),
    ({"watchdog": {"rules": [{"name": "x", "metric": "memprof_a", "op": ">", "threshold": "lots"}]}},
     "watchdog.rules[0].threshold"),
])
def test_bad_values_name_the_key(layer, key):
    with pytest.raises(ConfigError) as e:
        load_config(layer, environ={})
    assert e.value.key == key
    assert key in str(e.value)


def test_bad_env_names_the_variable():
    with pytest.raises(ConfigError) as e:
        load_config(environ={"MEMPROF_OTEL_SAMPLER_INTERVAL": "fast"})
    assert e.value.key == "MEMPROF_OTEL_SAMPLER_INTERVAL"
    with pytest.raises(ConfigError) as e:
        load_config(environ={"MEMPROF_OTEL_SAMPLER_BOGUS": "1"})
    assert e.value.key == "MEMPROF_OTEL_SAMPLER_BOGUS"


def test_unknown_kwarg():
    with pytest.raises(ConfigError):
        load_config(environ={}, not_a_key=1)


def test_bad_yaml_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("sampler: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})


def test_rules_parse_units_and_roundtrip():
    cfg = load_config({"watchdog": {"rules": [
        {"name": "gpu_high", "metric": "memprof_gpu_memory_used_bytes", "op": ">", "threshold": "20GiB",
         "for": "30s", "severity": "critical", "actions": ["log", "dump"]}]}}, environ={})
    r = cfg.watchdog.rules[0]
    assert r.threshold == 20 * 1024**3 and r.for_seconds == 30 and r.actions == ("log", "dump")
    again = load_config(cfg, environ={})
    assert again == cfg
    assert cfg.to_dict()["watchdog"]["rules"][0]["for"] == 30


def test_token_is_masked_in_dict():
    cfg = load_config({"http": {"token": "s3cret"}}, environ={})
    assert cfg.http.token == "s3cret" and cfg.to_dict()["http"]["token"] == "***"


def test_http_allowed_hosts_and_origins_from_file_and_env():
    env = {"MEMPROF_OTEL_HTTP_ALLOWED_HOSTS": "App.Internal, 10.0.0.1,[::1]",
           "MEMPROF_OTEL_HTTP_ALLOWED_ORIGINS": "https://grafana.example:3000"}
    cfg = load_config(None, environ=env)
    assert cfg.http.allowed_hosts == ("app.internal", "10.0.0.1", "::1")
    assert cfg.http.allowed_origins == ("https://grafana.example:3000",)
    assert load_config({"http": {"allowed_hosts": ["*"]}}, environ={}).http.allowed_hosts == ("*",)


@pytest.mark.parametrize("layer,key", [
    ({"http": {"allowed_hosts": ["http://app"]}}, "http.allowed_hosts"),
    ({"http": {"allowed_hosts": ["app:9464"]}}, "http.allowed_hosts"),
    ({"http": {"allowed_origins": ["*"]}}, "http.allowed_origins"),
    ({"http": {"allowed_origins": ["https://a.example/path"]}}, "http.allowed_origins"),
    ({"http": {"max_body_bytes": "1e999"}}, "http.max_body_bytes"),
    ({"dumps": {"max_oom_files": 0}}, "dumps.max_oom_files"),
    ({"watchdog": {"dump_min_interval": "1e999s"}}, "watchdog.dump_min_interval"),
    ({"attribution": {"overhead_budget": float("nan")}}, "attribution.overhead_budget"),
    ({"watchdog": {"rules": [{"name": "x", "metric": "memprof_a", "op": ">", "threshold": float("nan")}]}},
     "watchdog.rules[0].threshold"),
    ({"watchdog": {"rules": [{"name": "x", "metric": "memprof_a", "op": ">", "threshold": "inf"}]}},
     "watchdog.rules[0].threshold"),
    ({"watchdog": {"rules": [{"name": "x", "metric": "memprof_a", "op": ">", "threshold": 1, "for": 10**400}]}},
     "watchdog.rules[0].for"),
])
def test_non_finite_and_malformed_values_name_the_key(layer, key):
    with pytest.raises(ConfigError) as e:
        load_config(layer, environ={})
    assert e.value.key == key


def test_cuda_reset_peak_stats_defaults_on_and_turns_off_from_every_source():
    assert load_config().cuda.reset_peak_stats is True
    assert load_config(environ={"MEMPROF_OTEL_CUDA_RESET_PEAK_STATS": "false"}).cuda.reset_peak_stats is False
    assert load_config(reset_peak_stats=False).cuda.reset_peak_stats is False  # instrument(..., reset_peak_stats=False)
    assert load_config({"cuda": {"reset_peak_stats": False}}).cuda.reset_peak_stats is False
    with pytest.raises(ConfigError) as e:
        load_config({"cuda": {"reset_peak_stats": "maybe"}})
    assert e.value.key == "cuda.reset_peak_stats"


@pytest.mark.parametrize(("explicit", "environ", "expected"), [
    (None, {}, "memprof-otel"),
    ("svc", {"OTEL_SERVICE_NAME": "env-svc"}, "svc"),
    (None, {"OTEL_SERVICE_NAME": "env-svc", "OTEL_RESOURCE_ATTRIBUTES": "service.name=attr"}, "env-svc"),
    (None, {"OTEL_RESOURCE_ATTRIBUTES": "team=ml, service.name=my%20api ,x=y"}, "my api"),
    (None, {"OTEL_SERVICE_NAME": "  ", "OTEL_RESOURCE_ATTRIBUTES": "service.name="}, "memprof-otel"),
])
def test_service_name_in_effect_follows_the_otel_resource_order(explicit, environ, expected):
    # the order the OTel SDK's resource detectors apply, with an explicit service_name on top
    assert service_name_in_effect(explicit, environ) == expected


def test_a_bare_window_keyword_is_the_attribution_window_and_the_black_box_keeps_its_own() -> None:
    from memprof_otel.config import load_config
    cfg = load_config(environ={}, window="7s")
    assert cfg.attribution.window == 7.0
    assert cfg.blackbox.window != 7.0
    cfg = load_config(environ={}, blackbox={"window": "9s"})
    assert cfg.blackbox.window == 9.0 and cfg.attribution.window != 9.0
