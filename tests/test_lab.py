"""``flashcourse lab``: JupyterLab's own options pass through, and SIGTERM stops the server and its kernels."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from flashcourse import cli


def test_jupyterlab_options_pass_through(capsys):
    assert cli.main(["lab", "exercises", "--dry-run", "--no-browser", "--port", "8890", "--ip=0.0.0.0",
                     "--allow-root"]) == 0
    out = capsys.readouterr().out
    assert "-m jupyterlab" in out and "/lab/tree/exercises" in out
    assert out.rstrip().endswith("--no-browser --port 8890 --ip=0.0.0.0 --allow-root")
    assert cli.main(["lab", "homework", "--dry-run"]) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_sigterm_stops_the_server(tmp_path):
    pytest.importorskip("jupyterlab")
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    proc = subprocess.Popen([sys.executable, "-m", "flashcourse.cli", "lab", "--no-browser", "--port", str(port),
                             "--ip", "127.0.0.1", "--allow-root", "--ServerApp.token=t"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not _listening(port):
            assert proc.poll() is None and time.time() < deadline, "JupyterLab did not start"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        time.sleep(1)
        assert not _listening(port), "the server still listens after flashcourse lab ended"
    finally:
        if proc.poll() is None:
            proc.kill()
