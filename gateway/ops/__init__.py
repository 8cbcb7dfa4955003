"""Operations: the admin server, status, metrics, tap, top, reload, logging.

Everything here sees the running gateway through a narrow view, never by
reaching into the runtime's objects.
"""
