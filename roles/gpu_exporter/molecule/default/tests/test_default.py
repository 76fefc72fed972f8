"""What is left on a GPU-less host after the gpu_exporter role ran (converge.yml): nothing at all."""

from __future__ import annotations


def test_no_exporter_listens(host):
    assert not host.socket("tcp://0.0.0.0:9400").is_listening
    assert not host.socket(f"tcp://{host.check_output('hostname -I').split()[0]}:9400").is_listening


def test_nothing_was_installed_for_it(host):
    # Docker and the image are the exporter's only needs: a skipped host gets neither.
    assert not host.exists("docker")
    assert not [name for name in host.file("/var/tmp").listdir() if name.startswith("llmfleet-")]
