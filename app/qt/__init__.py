"""The app's PySide6 + qasync layer: the engine bridge to Qt signals, the chat service, window, views and dialogs."""
