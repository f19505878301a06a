"""Two worker processes share one study on a real PostgreSQL server (started on loopback for
this module, stopped after it). Skips, saying why, without the server binaries (initdb, pg_ctl,
postgres) or a driver (psycopg2: ``pip install -e '.[test]'``). initdb refuses to run as
root, so as root the server runs as the ``postgres`` (else ``nobody``) user via ``runuser``."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_search_concurrency import CREATE_DRIVER, check_shared_budget, run_driver

SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
USER = "search"


def find_binaries() -> dict[str, str] | None:
    """The server binaries on PATH, else in Debian's /usr/lib/postgresql/<version>/bin."""
    found = {name: shutil.which(name) for name in SERVER_BINARIES}
    if all(found.values()):
        return found  # type: ignore[return-value]
    for bin_dir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        paths = {name: os.path.join(bin_dir, name) for name in SERVER_BINARIES}
        if all(os.access(p, os.X_OK) for p in paths.values()):
            return paths
    return None


def server_user() -> pwd.struct_passwd | None:
    """Who runs the server: ourselves, or (as root) an unprivileged account."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and no 'postgres' or 'nobody' user to run initdb as")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, bins: dict[str, str], user: pwd.struct_passwd | None) -> None:
        self.bins, self.user = bins, user
        self.base = Path(tempfile.mkdtemp(prefix="search-pg-"))  # /tmp: reachable by `user`
        if user is not None:
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.data, self.sockets = self.base / "data", self.base / "sock"
        self.port = free_port()

    def run(self, *args: str) -> None:
        prefix = [] if self.user is None else ["runuser", "-u", self.user.pw_name, "--"]
        result = subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=120, cwd=self.base
        )
        assert result.returncode == 0, f"{args[0]} failed:\n{result.stdout}\n{result.stderr}"

    def start(self) -> None:
        self.run(self.bins["initdb"], "-D", str(self.data), "-U", USER, "--auth=trust",
                 "-E", "UTF8", "--locale=C", "--no-sync")  # fmt: skip
        self.run("mkdir", str(self.sockets))
        options = f"-h 127.0.0.1 -p {self.port} -k {self.sockets} -F"
        log = str(self.base / "server.log")
        self.run(self.bins["pg_ctl"], "-D", str(self.data), "-l", log, "-o", options, "-w",
                 "-t", "60", "start")  # fmt: skip

    def stop(self) -> None:
        try:
            self.run(self.bins["pg_ctl"], "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def create_database(self, name: str) -> str:
        import sqlalchemy

        admin = sqlalchemy.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return self.url(name)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/{database}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    bins = find_binaries()
    if bins is None:
        pytest.skip(f"PostgreSQL server binaries {SERVER_BINARIES} not found on PATH")
    pytest.importorskip("psycopg2", reason="no PostgreSQL driver: pip install psycopg2-binary")
    user = server_user()
    if user is not None and shutil.which("runuser") is None:
        pytest.skip("running as root and no runuser to start PostgreSQL as another user")
    pg = Server(bins, user)
    try:
        pg.start()
    except BaseException:
        shutil.rmtree(pg.base, ignore_errors=True)
        raise
    yield pg
    pg.stop()


def test_two_workers_share_one_postgres_study(server):
    url = server.create_database("shared_budget")
    results = check_shared_budget(url, budget=11, workers=2)
    assert sum(len(r["ran"]) for r in results) == 11


@pytest.mark.slow
def test_processes_create_one_new_postgres_study(server):
    urls = [server.create_database(f"race{r}") for r in range(3)]
    results = run_driver(CREATE_DRIVER, json.dumps(urls), "4")
    assert results == [None] * 12
