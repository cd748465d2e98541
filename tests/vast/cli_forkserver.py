"""Runs the pinned ``vastai`` CLI's commands, each in a process of its own, without paying for
its imports each time.

Run by the CLI's own Python (``var/vastai-cli/bin/python``), never imported by the tests: it
imports the CLI's module once (most of its imports), then for each command it reads it forks a
child that runs ``main()`` with that command line, its stdin, stdout and stderr on files,
exactly as the ``vastai`` script would. A new interpreter spent about a second a command on
those imports here, and the conformance run makes hundreds of commands. Every command still
starts from the same freshly imported state (nothing one command does is seen by the next),
since each runs in its own child and the server runs none.

One request per line on stdin, one answer per line on stdout, both JSON:
``{"args": [...], "input": "...", "timeout": 120}`` →
``{"returncode": 0, "stdout": "...", "stderr": "..."}`` (returncode null: it ran past timeout
and was killed).
"""

import atexit
import json
import os
import re
import sys
import tempfile
import time
import traceback


def load_cli():
    """The CLI's module, the most of its imports. ``main()`` imports its commands' modules
    itself, in its own order (which orders its commands), so each child does that part."""
    from vastai.cli import main  # noqa: F401


def script_name(executable: str) -> str:
    """``sys.argv[0]`` as the installed ``vastai`` script sets it."""
    return re.sub(r"(-script\.pyw|\.exe)?$", "", executable)


def exit_status(code) -> int:
    """The status Python gives a process whose ``sys.exit`` was called with ``code``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_child(executable: str, args: list, stdin: int, stdout: int, stderr: int) -> None:
    """In the forked child: become ``vastai <args>`` on these files, run, and exit."""
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    # The process's own streams, as a new interpreter makes them (they live until it exits).
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
    sys.argv = [script_name(executable), *args]
    from vastai.cli.main import main

    try:
        status = exit_status(main())
    except SystemExit as exit:
        status = exit_status(exit.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def wait(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None when it ran past ``timeout`` (it is killed)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


def serve(executable: str) -> None:
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # nothing of a child's reaches the requests or the answers
    os.dup2(null, 1)
    for line in requests:
        request = json.loads(line)
        with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, \
                tempfile.TemporaryFile() as stderr:  # fmt: skip
            stdin.write(request["input"].encode())
            stdin.flush()
            stdin.seek(0)
            pid = os.fork()
            if pid == 0:
                requests.close()
                answers.close()
                run_child(executable, request["args"], stdin.fileno(), stdout.fileno(),
                          stderr.fileno())  # fmt: skip
            returncode = wait(pid, request["timeout"])
            stdout.seek(0)
            stderr.seek(0)
            answer = {
                "returncode": returncode,
                "stdout": stdout.read().decode(errors="replace"),
                "stderr": stderr.read().decode(errors="replace"),
            }
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    executable = sys.argv[1]
    sys.argv = [script_name(executable)]  # the CLI's parser takes its name from it on import
    load_cli()
    serve(executable)
