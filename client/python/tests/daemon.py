"""Starts indexerd for the Python client tests: the cpu backend on
127.0.0.1:0, the port read from --port-file (polled with a deadline), and a
memfd socket in its temporary directory (self.memfd_socket)."""

import os
import pathlib
import subprocess
import tempfile
import time

_REPO = pathlib.Path(__file__).resolve().parents[3]


def indexerd_path():
    """$INDEXERD (set by ctest), else build/server/indexerd of the repository."""
    return os.environ.get("INDEXERD") or str(_REPO / "build" / "server" / "indexerd")


class Daemon:
    def __init__(self, profile="demo", extra=()):
        self.dir = tempfile.TemporaryDirectory(prefix="indexerd-py-")
        port_file = pathlib.Path(self.dir.name) / "port"
        self.memfd_socket = str(pathlib.Path(self.dir.name) / "memfd.sock")
        self.log = open(pathlib.Path(self.dir.name) / "log", "w+")
        self.proc = subprocess.Popen(
            [indexerd_path(), "--profile", profile, "--device", "cpu", "--threads", "2",
             "--listen", "127.0.0.1:0", "--port-file", str(port_file), "--log-level", "warn",
             # No router watches these daemons: stop at once on SIGTERM.
             "--drain-delay-ms", "0",
             "--memfd-socket", self.memfd_socket,
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            text = port_file.read_text() if port_file.exists() else ""
            if text.endswith("\n"):
                self.addr = f"127.0.0.1:{int(text)}"
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"indexerd did not start:\n{self.output()}")
            time.sleep(0.02)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()
