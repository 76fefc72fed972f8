"""roles/preflight/filter_plugins/preflight_probes.py: the data the preflight checks judge.

Each decision the role's evaluate.yml made in Jinja: which process is an engine's, how
much memory the engines hold per GPU, which GPU is short of free memory next to its
siblings, how df.sh's lines are read, and how disk requirements add up per filesystem.
"""

from __future__ import annotations

from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from llmfleet.paths import REPO_ROOT
from tests.tools import load_plugin

PLUGIN = REPO_ROOT / "roles" / "preflight" / "filter_plugins" / "preflight_probes.py"


probes = load_plugin(PLUGIN, "preflight_probes_under_test")
ENGINE = "a" * 64


def _gpu(index: int, free: int, name: str = "NVIDIA H100", **extra: Any) -> dict[str, Any]:
    return {"index": index, "name": name, "uuid": f"GPU-{index}", "pci_bus_id": f"0000:0{index}:00.0",
            "memory_total_mib": 81559, "memory_used_mib": 81559 - free, "memory_free_mib": free,
            "compute_capability": "9.0", **extra}


def _process(gpu: int, container: str | None, used: int | None = 1000, pid: int = 100) -> dict[str, Any]:
    return {"gpu_index": gpu, "pid": pid, "name": "python3", "container_id": container, "used_memory_mib": used}


def test_the_filter_map_names_every_filter() -> None:
    assert set(probes.FilterModule().filters()) == {
        "preflight_gpu_processes", "preflight_gpus", "preflight_gpu_memory_gaps", "preflight_df", "preflight_disk"}


@pytest.mark.parametrize(
    ("container", "engine"),
    [(ENGINE, True), ("b" * 64, False), (None, False), ("", False)],
    ids=["engine-container", "other-container", "on-the-host", "empty-id"],
)
def test_a_process_is_an_engines_only_in_an_engine_container(container: str | None, engine: bool) -> None:
    [process] = probes.preflight_gpu_processes([_process(0, container)], [ENGINE])
    assert process["engine"] is engine
    assert process["pid"] == 100


def test_no_processes_and_no_engines_give_nothing() -> None:
    assert probes.preflight_gpu_processes([], []) == []
    assert probes.preflight_gpu_processes(None, None) == []


def test_each_gpu_counts_only_its_engines_memory() -> None:
    probe = {"driver_version": "570.1", "gpus": [_gpu(0, 1000), _gpu(1, 2000, display_active="Enabled")],
             "processes": [_process(0, ENGINE, 500), _process(0, ENGINE, None), _process(0, "b" * 64, 700),
                           _process(0, None, 900), _process(1, ENGINE, 300)]}
    gpus = probes.preflight_gpus(probe, [ENGINE])
    assert [gpu["memory_engine_mib"] for gpu in gpus] == [500, 300]
    assert gpus[0]["display_active"] == "N/A"
    assert gpus[1]["display_active"] == "Enabled"
    assert gpus[0]["driver_version"] == "570.1"
    assert list(gpus[0]) == ["index", "name", "uuid", "pci_bus_id", "memory_total_mib", "memory_used_mib",
                             "memory_free_mib", "memory_engine_mib", "display_active", "driver_version",
                             "compute_capability"]


def test_a_probe_without_gpus_gives_none_and_needs_no_driver_version() -> None:
    assert probes.preflight_gpus({"state": "absent"}, []) == []


def test_a_gpu_missing_a_key_is_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="lacks"):
        probes.preflight_gpus({"driver_version": "570.1", "gpus": [{"index": 0}]}, [])


def _with_engine(gpu: dict[str, Any], engine: int = 0) -> dict[str, Any]:
    return {**gpu, "memory_engine_mib": engine, "display_active": gpu.get("display_active", "N/A")}


def test_a_gpu_far_below_its_sibling_is_a_gap() -> None:
    gaps = probes.preflight_gpu_memory_gaps([_with_engine(_gpu(0, 80000)), _with_engine(_gpu(1, 60000))], 10)
    assert gaps == [{"index": 1, "name": "NVIDIA H100", "total": 81559, "used": 21559, "free": 60000,
                     "display": "N/A", "sibling": 0, "sibling_free": 80000, "gap": 20000, "gap_pct": 25.0}]


def test_a_gap_exactly_at_the_threshold_is_not_one() -> None:
    assert probes.preflight_gpu_memory_gaps([_with_engine(_gpu(0, 1000)), _with_engine(_gpu(1, 900))], 10) == []
    assert len(probes.preflight_gpu_memory_gaps([_with_engine(_gpu(0, 1000)), _with_engine(_gpu(1, 899))], 10)) == 1


def test_memory_the_engines_hold_counts_as_free() -> None:
    gpus = [_with_engine(_gpu(0, 80000)), _with_engine(_gpu(1, 1000), engine=79000)]
    assert probes.preflight_gpu_memory_gaps(gpus, 10) == []


def test_only_gpus_of_the_same_model_are_siblings() -> None:
    gpus = [_with_engine(_gpu(0, 80000)), _with_engine(_gpu(1, 100, name="NVIDIA T400"))]
    assert probes.preflight_gpu_memory_gaps(gpus, 10) == []
    assert probes.preflight_gpu_memory_gaps([_with_engine(_gpu(0, 80000))], 10) == []


def test_siblings_with_no_free_memory_make_no_gap() -> None:
    assert probes.preflight_gpu_memory_gaps([_with_engine(_gpu(0, 0)), _with_engine(_gpu(1, 0))], 10) == []


def test_the_gap_is_to_the_freest_sibling_the_last_of_equals() -> None:
    gpus = [_with_engine(_gpu(0, 100)), _with_engine(_gpu(1, 300)), _with_engine(_gpu(2, 300))]
    gaps = probes.preflight_gpu_memory_gaps(gpus, 10)
    assert [(gap["index"], gap["sibling"], gap["gap_pct"]) for gap in gaps] == [(0, 2, 66.7)]


def test_df_lines_are_read_and_others_skipped() -> None:
    lines = ["/srv/models\t/\t1048576\t2097152", "/dev/shm\t/dev/shm\t65536.5\t65536",
             "garbage", "/x\t/\tnot-a-number\t1"]
    assert probes.preflight_df(lines) == {
        "/srv/models": {"mount": "/", "available_kib": 1048576, "size_kib": 2097152},
        "/dev/shm": {"mount": "/dev/shm", "available_kib": 65536, "size_kib": 65536},
        "/x": {"mount": "/", "available_kib": 0, "size_kib": 1},
    }


def test_df_refuses_what_is_not_a_list() -> None:
    with pytest.raises(AnsibleFilterError, match="expected a list"):
        probes.preflight_df("/srv\t/\t1\t1")


def test_requirements_on_one_filesystem_add_up() -> None:
    df = {"/srv/models": {"mount": "/", "available_kib": 30 * 1048576, "size_kib": 0},
          "/var/lib/docker": {"mount": "/", "available_kib": 30 * 1048576, "size_kib": 0},
          "/data": {"mount": "/data", "available_kib": 1572864, "size_kib": 0}}
    requirements = [{"path": "/srv/models", "min_gib": 20, "purpose": "models"},
                    {"path": "/var/lib/docker", "min_gib": 15},
                    {"path": "/data", "min_gib": 1},
                    {"path": "/not-probed", "min_gib": 999}]
    assert probes.preflight_disk(requirements, df) == [
        {"mount": "/", "available_gib": 30.0, "needed_gib": 35,
         "uses": ["models in /srv/models 20 GiB", "/var/lib/docker in /var/lib/docker 15 GiB"], "short": True},
        {"mount": "/data", "available_gib": 1.5, "needed_gib": 1, "uses": ["/data in /data 1 GiB"], "short": False},
    ]


def test_no_requirements_give_no_filesystems() -> None:
    assert probes.preflight_disk([], {}) == []
