"""The commands beside serving: ``check``, ``offsets`` and offset ranges, feature loading,
progress lines, and ``model inspect / optimize / compare``."""
