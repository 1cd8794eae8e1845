#!/usr/bin/env python3
"""Record a command's terminal session as an asciinema v2 cast (for docs): ``asciinema play FILE`` replays it.

    python scripts/record_cast.py docs/live-status.cast --cols 132 --rows 16 -- millwheel run topologies/zeitgeist

The command runs on a pseudo-terminal of the given size (so it draws as on a terminal);
what it writes is passed through to this terminal and recorded with its timing. No
dependency beyond the standard library.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import struct
import sys
import termios
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the .cast file to write")
    p.add_argument("--cols", type=int, default=120)
    p.add_argument("--rows", type=int, default=14)
    p.add_argument("--title", default=None)
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        p.error("give the command after --")
    at = argv.index("--")
    args, command = p.parse_args(argv[:at]), argv[at + 1 :]
    if not command:
        p.error("give the command after --")
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, on the pseudo-terminal
        os.environ["COLUMNS"], os.environ["LINES"] = str(args.cols), str(args.rows)
        os.execvp(command[0], command)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", args.rows, args.cols, 0, 0))
    started = time.monotonic()
    header = {
        "version": 2,
        "width": args.cols,
        "height": args.rows,
        "timestamp": int(time.time()),
        "title": args.title or " ".join(command),
        "env": {"TERM": "xterm-256color"},
    }
    with open(args.out, "w", encoding="utf-8") as cast:
        cast.write(json.dumps(header) + "\n")
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the command ended: the pseudo-terminal is closed
                break
            if not data:
                break
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            cast.write(
                json.dumps(
                    [round(time.monotonic() - started, 3), "o", data.decode(errors="replace")]
                )
                + "\n"
            )
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
