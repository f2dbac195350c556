#!/usr/bin/env python3
"""Drives `hipscope chat` in a pseudo-terminal, for a machine without a Rust toolchain (the GPU
machine). Usage: scripts/chat-smoke.py hipscope chat MODEL [--backend B] [-n N].
Waits for the model, asks, waits, grows the Watchdog panel from the keyboard, quits with Ctrl-C;
prints the exit code and the words seen (escape sequences removed)."""
import os, pty, re, select, sys, time

argv = sys.argv[1:]
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "xterm-256color"
    os.execvp(argv[0], argv)

import fcntl, struct, termios
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 160, 0, 0))
buf = bytearray()

def pump(secs):
    end = time.time() + secs
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                return False
            if not d:
                return False
            buf.extend(d)
    return True

pump(8)
os.write(fd, b"Say hello in French.\r")
pump(8)
os.write(fd, b"\x1b")  # Esc: stop the answer if it still runs
pump(1.5)
for _ in range(3):
    os.write(fd, b"\x1b[1;3B")  # Alt-Down: pick the next panel (the third: Watchdog)
    pump(0.2)
for _ in range(4):
    os.write(fd, b"\x1b+")  # Alt-+: two rows taller each
    pump(0.2)
pump(1.5)
mark = len(buf)
os.write(fd, b"\x03")  # Ctrl-C when idle: quit
t0 = time.time()
code = None
while time.time() - t0 < 20:
    pump(0.3)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        code = os.waitstatus_to_exitcode(status)
        break
if code is None:
    os.kill(pid, 9)
    code = "did not exit within 20 s (killed)"
text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b\][^\x07]*\x07", b" ", bytes(buf)).decode("utf-8", "replace")
words = re.sub(r"\s+", " ", text)
for key in ["cuda", "NVIDIA", "Streams", "queue", "Arena", "weights", "kv_cache", "Watchdog", "OK", "drain", "destroy stream", "t/s", "Alt-+/- height", "op age over time"]:
    print(f"{key!r:18} {'seen' if key in words else 'NOT seen'}")
m = re.search(r"(TTFT[^│]{0,80})", words)
print("stats:", m.group(1) if m else "none")
tail = re.sub(r"\s+", " ", re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b" ", bytes(buf[mark:])).decode("utf-8", "replace"))
print("after Ctrl-C:", tail[:600])
print("exit code:", code, "quit took %.2f s" % (time.time() - t0))
