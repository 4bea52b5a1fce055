"""Parley's desktop app: a Qt-free core (chats, their SQLite store, models, settings) and the PySide6 layer over it."""
