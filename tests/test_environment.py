"""The environment record: read from real ``nvidia-smi -q`` reports, probed on this machine
without ever failing, and compared field by field (blocking groups, reported fields, the
override)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from perfguard.baseline import nvidia_smi, probe
from perfguard.baseline.fingerprint import machine_fingerprint
from perfguard.environment import (
    GROUPS,
    Environment,
    EnvironmentChange,
    incompatibility,
    parse_across,
)

SMI = Path(__file__).resolve().parent / "data" / "nvidia_smi"
H100_OLD = SMI / "h100x8_driver535.161.08.txt"
H100_NEW = SMI / "h100x8_driver535.183.01.txt"
TITAN_V = SMI / "titanv_driver560.35.03.txt"


def report(path: Path) -> nvidia_smi.SmiReport:
    return nvidia_smi.parse_report(path.read_text())


def test_a_real_h100_report_gives_driver_clocks_power_ecc_mig_persistence():
    r = report(H100_OLD)
    assert (r.driver, r.cuda, len(r.gpus)) == ("535.161.08", "12.2", 8)
    assert r.gpu_names == ["NVIDIA H100 80GB HBM3"] * 8
    env = r.environment()
    assert env == Environment(
        driver="535.161.08",
        driver_cuda="12.2",
        app_sm_clock="1980 MHz",
        app_mem_clock="2619 MHz",
        max_sm_clock="1980 MHz",
        max_mem_clock="2619 MHz",
        power_limit="700 W",
        ecc="on",
        mig="off",
        persistence="on",
    )


def test_a_newer_report_layout_and_not_applicable_settings():
    """TITAN V on driver 560: ECC and MIG are N/A (unknown, not 'off'), persistence off,
    application clocks below the maximum."""
    env = report(TITAN_V).environment()
    assert (env.driver, env.driver_cuda, env.power_limit) == ("560.35.03", "12.6", "250 W")
    assert (env.ecc, env.mig, env.persistence) == ("", "", "off")
    assert (env.app_sm_clock, env.max_sm_clock) == ("1200 MHz", "1912 MHz")


def test_gpus_that_differ_in_a_setting_list_each_value():
    text = H100_OLD.read_text()
    first_limit = text.index("Current Power Limit")
    changed = text[:first_limit] + text[first_limit:].replace("700.00 W", "350.00 W", 1)
    assert nvidia_smi.parse_report(changed).environment().power_limit == "350 W, 700 W"


def test_the_fingerprint_takes_gpus_and_driver_from_the_sessions_report(monkeypatch):
    monkeypatch.setattr(nvidia_smi, "query", lambda *a, **k: pytest.fail("asked twice"))
    fp = machine_fingerprint("nsys", smi=report(H100_NEW))
    assert (fp.gpu_name, fp.driver) == ("NVIDIA H100 80GB HBM3", "535.183.01")


def _fake_smi(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_query_reads_the_report_nvidia_smi_prints(tmp_path, monkeypatch):
    _fake_smi(tmp_path, f'[ "$1" = "-q" ] && exec cat "{H100_NEW}"; exit 6', monkeypatch)
    found = nvidia_smi.query()
    assert found is not None and found.driver == "535.183.01" and len(found.gpus) == 8


@pytest.mark.parametrize(
    "body", ["exec sleep 30", "echo 'NVIDIA-SMI has failed' >&2; exit 9", "echo garbage"]
)
def test_a_hung_failing_or_foreign_nvidia_smi_leaves_the_gpu_fields_unknown(
    tmp_path, monkeypatch, body
):
    _fake_smi(tmp_path, body, monkeypatch)
    started = time.monotonic()
    found = nvidia_smi.query(timeout=0.5)
    env = probe.machine_environment(found)
    assert time.monotonic() - started < 10
    assert found is None and env.driver == "" and env.power_limit == ""
    assert env.perfguard and env.git  # the rest is still there


def test_this_machine_without_nvidia_smi():
    env = probe.machine_environment(None)
    assert env.driver == "" and env.app_sm_clock == ""
    assert env.torch.startswith("2.") and env.cpu and env.perfguard
    assert env.smt in ("", "on", "off")


def test_the_probe_never_imports_torch_tensorflow_or_jax():
    code = (
        "import sys\n"
        "from perfguard.baseline.probe import machine_environment\n"
        "env = machine_environment(None)\n"
        "bad = [m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(env.torch)\n"
    )
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("2.")  # from the installed package's metadata


def test_a_broken_host_file_leaves_its_field_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "cpu_quota", lambda: 1 / 0)
    monkeypatch.setattr(probe, "governor", lambda: open(tmp_path / "missing").read())
    env = probe.machine_environment(None)
    assert (env.cpu_quota, env.governor) == ("", "")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cgroup.controllers": "cpu", "cpu.max": "max 100000"}, "none"),
        ({"cgroup.controllers": "cpu", "cpu.max": "200000 100000"}, "2 CPUs"),
        (
            {"cgroup.controllers": "cpu", "cpu.max": "max 100000", "job/cpu.max": "50000 100000"},
            "0.5 CPUs",
        ),
    ],
)
def test_cgroup_v2_cpu_quota_is_the_tightest_level(tmp_path, files, expected):
    mount = tmp_path / "cg"
    for name, text in files.items():
        (mount / name).parent.mkdir(parents=True, exist_ok=True)
        (mount / name).write_text(text)
    (mount / "job").mkdir(exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job\n")
    assert probe.cpu_quota(str(proc), str(mount)) == expected


def test_cgroup_v1_cpu_quota(tmp_path):
    mount = tmp_path / "cg"
    (mount / "cpu,cpuacct").mkdir(parents=True)
    (mount / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("400000\n")
    (mount / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("3:cpu,cpuacct:/\n0::/\n")
    assert probe.cpu_quota(str(proc), str(mount)) == "4 CPUs"
    (mount / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert probe.cpu_quota(str(proc), str(mount)) == "none"


# ------------------------------------------------------------------------ comparing


def test_a_driver_patch_release_is_reported_a_new_branch_blocks():
    old, new = report(H100_OLD).environment(), report(H100_NEW).environment()
    (patch,) = new.changes_since(old)
    assert patch == EnvironmentChange("driver", "driver", "535.161.08", "535.183.01")
    assert incompatibility([patch]) is None
    branch = Environment(driver="575.51.03").changes_since(Environment(driver="535.183.01"))
    assert branch[0].blocking
    why = incompatibility(branch)
    assert why is not None and "driver 535.183.01 → 575.51.03" in why
    assert "--perfguard-compare-across driver" in why and "--compare-across driver" in why


def test_clocks_power_ecc_mig_and_quota_block_libraries_are_reported():
    base = report(H100_OLD).environment().filled_from(Environment(cudnn="9.1.0.70"))
    now = Environment(
        app_sm_clock="1410 MHz",
        power_limit="350 W",
        ecc="off",
        mig="on",
        cpu_quota="2 CPUs",
        cudnn="9.3.0.75",
        torch="2.6.0",
    )
    base = base.filled_from(Environment(cpu_quota="none", torch="2.5.1"))
    changes = {c.field: c for c in now.changes_since(base)}
    assert {f for f, c in changes.items() if c.blocking} == {
        "app_sm_clock",
        "power_limit",
        "ecc",
        "mig",
        "cpu_quota",
    }
    assert changes["cudnn"].text == "cuDNN 9.1.0.70 → 9.3.0.75"
    assert not changes["torch"].blocking


def test_an_unknown_value_never_differs():
    assert Environment(driver="535.1.1").changes_since(Environment()) == ()
    assert Environment().changes_since(Environment(cudnn="9.1")) == ()


def test_comparing_across_a_group_says_so():
    base, now = Environment(driver="535.183.01"), Environment(driver="575.51.03")
    (c,) = now.changes_since(base, parse_across(["driver"]))
    assert not c.blocking and c.across == "driver"
    assert c.text == "driver 535.183.01 → 575.51.03 (compared across driver)"
    assert now.changes_since(base, parse_across(["all"]))[0].across == "driver"


def test_across_names_are_checked():
    assert parse_across(["driver,clocks", "mig"]) == {"driver", "clocks", "mig"}
    with pytest.raises(ValueError, match="cannot compare across cudnn: the groups are"):
        parse_across(["cudnn"])
    assert set(GROUPS) == {"driver", "clocks", "power_limit", "ecc", "mig", "cpu_quota"}


def test_round_trip_keeps_known_fields_only():
    env = report(TITAN_V).environment()
    assert Environment.from_dict(env.to_dict()) == env
    assert "ecc" not in env.to_dict()
    assert Environment.from_dict({"driver": "1.2", "future_field": "x"}) == Environment(
        driver="1.2"
    )
    assert Environment.from_dict(None).empty
