"""The example's table, through Flask-SQLAlchemy."""

from __future__ import annotations

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Signup(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str] = mapped_column(String(320))
    welcomed_at: Mapped[str | None] = mapped_column(String(40), default=None)
