"""``flashcourse lab``: JupyterLab's own options pass through, root gets --allow-root, and SIGTERM or
Ctrl-C stops the server within seconds."""
import os
import pty
import signal
import socket
import subprocess
import sys
import time

import argparse
import threading

import pytest

from flashcourse import cli, lab


def test_jupyterlab_options_pass_through(capsys):
    assert cli.main(["lab", "exercises", "--dry-run", "--no-browser", "--port", "8890", "--ip=0.0.0.0",
                     "--allow-root"]) == 0
    out = capsys.readouterr().out
    assert "-m jupyterlab" in out and "/lab/tree/exercises" in out
    assert out.rstrip().endswith("--no-browser --port 8890 --ip=0.0.0.0 --allow-root")
    assert cli.main(["lab", "homework", "--dry-run"]) == 2


def test_root_gets_allow_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 0, raising=False)
    assert cli.main(["lab", "--dry-run", "--no-browser"]) == 0
    out, err = capsys.readouterr()
    assert out.split().count("--allow-root") == 1 and "root" in err and "--allow-root" in err
    assert cli.main(["lab", "--dry-run", "--allow-root"]) == 0          # given already: not twice, no note
    out, err = capsys.readouterr()
    assert out.split().count("--allow-root") == 1 and err == ""
    monkeypatch.setattr(os, "geteuid", lambda: 1000, raising=False)
    assert cli.main(["lab", "--dry-run", "--no-browser"]) == 0
    out, err = capsys.readouterr()
    assert "--allow-root" not in out and err == ""


def _run_with_sigterm(monkeypatch, tmp_path, child: str) -> tuple[int, float]:
    """lab.run on a stand-in for JupyterLab (python -c CHILD, which touches tmp_path/ready once its
    handlers are set), this process sent SIGTERM once it is ready: (exit status, seconds to stop)."""
    ready = tmp_path / "ready"
    monkeypatch.setattr(lab, "lab_command", lambda folder, extra=(): [
        sys.executable, "-c", f"import pathlib, signal, time\n{child}\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)"])
    sent = []

    def signal_when_ready():
        deadline = time.time() + 30
        while not ready.exists() and time.time() < deadline:
            time.sleep(0.05)
        sent.append(time.time())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_when_ready, daemon=True).start()
    rc = lab.run(argparse.Namespace(argv=["--no-browser"]))
    return rc, time.time() - sent[0]


def test_sigterm_handler_does_not_wait_out_its_time(monkeypatch, tmp_path):
    monkeypatch.setattr(lab, "STOP_SECONDS", 10)
    rc, took = _run_with_sigterm(monkeypatch, tmp_path, "")
    assert rc == -signal.SIGTERM and took < 3, (rc, took)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL        # the handlers are put back


def test_a_child_that_ignores_sigterm_is_killed_after_stop_seconds(monkeypatch, tmp_path):
    monkeypatch.setattr(lab, "STOP_SECONDS", 1)
    rc, took = _run_with_sigterm(monkeypatch, tmp_path, "signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    assert rc == -signal.SIGKILL and 1 <= took < 4, (rc, took)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


#: Seconds flashcourse lab may take to stop after SIGTERM or Ctrl-C: JupyterLab itself stops in about 1 s
#: on a loaded 2-core machine; a handler that waits on the wait it interrupted takes STOP_SECONDS (20 s).
STOP_LIMIT = 5


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C in a terminal"])
def test_a_stop_signal_stops_the_server_quickly(tmp_path, how):
    pytest.importorskip("jupyterlab")
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    # a terminal: stdin is a tty (JupyterLab alone would then ask "Shut down this Jupyter server?" on Ctrl-C),
    # and Ctrl-C signals the whole process group, here a session of its own
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "flashcourse.cli", "lab", "--no-browser", "--port", str(port),
                             "--ip", "127.0.0.1", "--ServerApp.token=t"], env=env, stdin=slave,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not _listening(port):
            assert proc.poll() is None and time.time() < deadline, "JupyterLab did not start"
            time.sleep(0.5)
        start = time.time()
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.time() - start
        assert took < STOP_LIMIT, f"flashcourse lab took {took:.1f} s to stop after {how}"
        assert proc.returncode == 0, proc.returncode
        time.sleep(1)
        assert not _listening(port), "the server still listens after flashcourse lab ended"
    finally:
        os.close(master)
        os.close(slave)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
