"""The README's main job runs end to end: real processes, a killed leader, a catch-up."""

import socket
import subprocess
import sys


def _free_base_port() -> int:
    """A base port with the 13 ports the demo uses (base..base+12) all free right now."""
    for base in range(28000, 40000, 50):
        try:
            socks = []
            for port in list(range(base, base + 3)) + list(range(base + 10, base + 13)):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        return base
    raise RuntimeError("no free port range")


def test_demo_survives_a_killed_leader_and_heals(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "flotilla.demo", "--dir", str(tmp_path / "demo"),
         "--base-port", str(_free_base_port())],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "writes resumed" in out
    assert "serves after049 locally: still here" in out
    assert "keys under 'key': 100 of 100" in out
