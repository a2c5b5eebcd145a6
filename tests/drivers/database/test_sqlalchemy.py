"""Dispatch within a SQLAlchemy Connection or Session (and Flask-SQLAlchemy's
``db.session``): the job commits, or rolls back, with the caller's transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from rainier_sync import QueueManager

from .test_driver import Hello, make_manager, once, ran

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session, scoped_session, sessionmaker  # noqa: E402

_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}


def sqlalchemy_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{_DRIVERS[scheme]}://{rest}"


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


@pytest.fixture
def manager(db_url: str) -> Iterator[QueueManager]:
    manager = make_manager(db_url)
    yield manager
    manager.close()


@pytest.fixture
def engine(db_url: str) -> Iterator[Any]:
    engine = create_engine(sqlalchemy_url(db_url))
    yield engine
    engine.dispose()


def _kept_only(manager: QueueManager, kept: str | None) -> None:
    queue: Any = manager.connection()
    assert queue.size() == 1
    assert once(manager).processed == 1 and ran == ["kept"]
    assert kept is not None


def test_a_connection_commits_or_rolls_back_the_job(manager: QueueManager, engine: Any) -> None:
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # a transaction already begun (autobegin)
        manager.pending(Hello("rolled back")).within(conn).send()
        conn.rollback()
        assert manager.connection().size() == 0  # type: ignore[attr-defined]
        # none begun yet: the dispatch begins it, and commit() commits the job
        kept = manager.pending(Hello("kept")).within(conn).send()
        conn.commit()
    _kept_only(manager, kept)


def test_a_connection_from_engine_begin(manager: QueueManager, engine: Any) -> None:
    with pytest.raises(ZeroDivisionError), engine.begin() as conn:
        manager.pending(Hello("rolled back")).within(conn).send()
        raise ZeroDivisionError
    with engine.begin() as conn:
        kept = manager.pending(Hello("kept")).within(conn).send()
    _kept_only(manager, kept)


def test_a_session_commits_or_rolls_back_the_job(manager: QueueManager, engine: Any) -> None:
    with Session(engine) as session:
        manager.pending(Hello("rolled back")).within(session).send()
        session.rollback()
        assert manager.connection().size() == 0  # type: ignore[attr-defined]
        kept = manager.pending(Hello("kept")).within(session).send()
        session.commit()
    _kept_only(manager, kept)


def test_a_scoped_session(manager: QueueManager, engine: Any) -> None:
    scoped = scoped_session(sessionmaker(engine))
    try:
        manager.pending(Hello("rolled back")).within(scoped).send()
        scoped.rollback()
        kept = manager.pending(Hello("kept")).within(scoped).send()
        scoped.commit()
    finally:
        scoped.remove()
    _kept_only(manager, kept)


def test_a_session_with_the_applications_own_writes(sqlite_url: str) -> None:
    manager = make_manager(sqlite_url)
    engine = create_engine(sqlalchemy_url(sqlite_url))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders (id) VALUES (1)"))
        manager.pending(Hello("kept")).within(session).send()
        session.commit()
        session.execute(text("INSERT INTO orders (id) VALUES (2)"))
        manager.pending(Hello("rolled back")).within(session).send()
        session.rollback()
        assert session.execute(text("SELECT count(*) FROM orders")).scalar() == 1
    assert manager.connection().size() == 1  # type: ignore[attr-defined]
    engine.dispose()
    manager.close()


# -- refusals -----------------------------------------------------------------------------------


def test_a_session_on_another_dialect_is_refused_naming_both(pg_url: str, tmp_path: Path) -> None:
    manager = make_manager(pg_url)
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Session(engine) as session, pytest.raises(TypeError) as caught:
        manager.pending(Hello("x")).within(session).send()
    message = str(caught.value)
    assert "needs an open postgresql connection" in message and "a SQLAlchemy Session on sqlite+pysqlite" in message
    engine.dispose()
    manager.close()


def test_a_session_on_another_sqlite_file_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    manager = make_manager(sqlite_url)
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Session(engine) as session, pytest.raises(TypeError, match="app.db, not on the queue's file"):
        manager.pending(Hello("x")).within(session).send()
    engine.dispose()
    manager.close()


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_a_session_on_another_database_of_the_server_is_refused(request: pytest.FixtureRequest, dialect: str) -> None:
    import urllib.parse

    url = str(request.getfixturevalue("pg_url" if dialect == "postgresql" else "my_url"))
    other = "postgres" if dialect == "postgresql" else "mysql"
    manager = make_manager(url)
    parts = urllib.parse.urlsplit(sqlalchemy_url(url))
    engine = create_engine(urllib.parse.urlunsplit(parts._replace(path=f"/{other}")))
    with engine.connect() as conn, pytest.raises(TypeError) as caught:
        manager.pending(Hello("x")).within(conn).send()
    message = str(caught.value)
    assert f"connected to the database {other!r}" in message and "but the queue is in the" in message
    engine.dispose()
    manager.close()


def test_an_engine_is_not_a_transaction(sqlite_url: str) -> None:
    manager = make_manager(sqlite_url)
    engine = create_engine(sqlalchemy_url(sqlite_url))
    with pytest.raises(TypeError, match="takes a SQLAlchemy Connection or Session, got Engine"):
        manager.pending(Hello("x")).within(engine).send()
    engine.dispose()
    manager.close()


# -- Flask-SQLAlchemy ---------------------------------------------------------------------------


def test_flask_sqlalchemy_db_session(sqlite_url: str) -> None:
    flask = pytest.importorskip("flask")
    flask_sqlalchemy = pytest.importorskip("flask_sqlalchemy")
    app = flask.Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(sqlite_url)
    db = flask_sqlalchemy.SQLAlchemy(app)

    class Order(db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "orders"
        id = db.Column(db.Integer, primary_key=True)

    manager = make_manager(sqlite_url)

    @app.post("/orders/<int:number>")
    def place(number: int) -> str:
        db.session.add(Order(id=number))
        job_id = manager.pending(Hello(f"order {number}")).within(db.session).send()
        if number % 2:
            db.session.rollback()
            return "declined"
        db.session.commit()
        return str(job_id)

    with app.app_context():
        db.create_all()
    client = app.test_client()
    kept = client.post("/orders/2").get_data(as_text=True)
    assert client.post("/orders/3").get_data(as_text=True) == "declined"
    with app.app_context():
        assert [order.id for order in db.session.scalars(db.select(Order))] == [2]
        db.engine.dispose()
    assert manager.connection().size() == 1  # type: ignore[attr-defined]
    assert once(manager).processed == 1 and ran == ["order 2"]
    assert kept
    manager.close()
