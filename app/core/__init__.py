"""The app's Qt-free core: the chat tree and its SQLite store, the model registry, settings, export/import, message HTML."""
