"""The README's main job runs end to end: real processes, a killed leader, a catch-up."""

import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def _checkout_copy(dest: Path) -> Path:
    """The tracked files of this checkout, copied to `dest`: what a fresh clone's root holds
    (with this tree's uncommitted changes, which are what is under test)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, target)
    return dest


def test_demo_runs_as_make_demo_runs_it_from_a_fresh_clone(tmp_path):
    """`make demo` is `python -m flotilla.demo` from the clone's root with the default,
    relative `--dir .flotilla/demo`: every path the demo builds from it must still be right
    once members run in the cluster directory and the restore builds archive URLs."""
    clone = _checkout_copy(tmp_path / "clone")
    result = subprocess.run([sys.executable, "-m", "flotilla.demo"], cwd=clone,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()
    restored = next(line for line in last if "restored cluster" in line)
    assert "100 of 100 keys, after049 = still here" in restored, result.stdout
    assert "and takes new writes" in result.stdout
    assert last[-1].startswith("==> done:"), result.stdout
    root = clone / ".flotilla" / "demo"
    assert not (root / ".flotilla").exists(), "a member's data dir was nested in the cluster dir"
    assert not any(root.glob("n[4-9]")), "scale-down left a removed member's data dir behind"
    leftovers = subprocess.run(["pgrep", "-f", str(clone)], capture_output=True, text=True)
    assert leftovers.stdout == "", f"member processes left running: {leftovers.stdout}"
