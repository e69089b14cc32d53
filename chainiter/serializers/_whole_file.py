"""A file written whole or not at all: ``write_whole`` writes a new file
beside the old one, flushed to the disk, which then takes the old one's
place (``save_npz`` given a path)."""

import errno
import os
import secrets
import stat

from chainiter._interrupts import uninterrupted


def write_whole(path, write):
    """``write(f)`` into a new file beside ``path`` (the file a symbolic
    link names), flushed to the disk, which then takes the place of
    ``path``: a save that fails (a full disk, a Ctrl-C) leaves the
    snapshot that was there whole.  A file saved over keeps its mode and,
    where this process may set it, its owner (the new file is private
    until then); a new one gets what ``open()`` gives.  Other hard links
    to the old file keep the old snapshot.  A process killed outright
    (SIGKILL) may leave the new file behind, named
    ``.NAME.XXXXXXXX.partial``.  Where no file may be made beside it, or
    put in its place (a directory one may not write, a sticky one, a
    file mounted there), or where it is no regular file (a pipe, a
    device), ``path`` is written in place, as ``open()`` would."""
    given = os.fsdecode(path)
    if given.endswith(os.sep) or os.path.isdir(given):
        raise IsADirectoryError(errno.EISDIR, 'Is a directory', given)
    path = os.path.realpath(given)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    if old is not None and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, 'Permission denied', given)
    if old is not None and not stat.S_ISREG(old.st_mode):
        _write_in_place(path, write)
        return
    directory, name = os.path.split(path)
    if len(os.fsencode(name)) > 200:     # room for the rest of the name
        name = 'snapshot'
    partial = f = None
    try:
        while partial is None:
            candidate = os.path.join(directory, '.{}.{}.partial'.format(
                name, secrets.token_hex(4)))
            with uninterrupted():     # made and known, or not made
                try:
                    fd = os.open(candidate,
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 0o666 if old is None else 0o600)
                except FileExistsError:
                    continue
                except PermissionError:
                    break
                except FileNotFoundError:    # named as open() names it
                    raise FileNotFoundError(
                        errno.ENOENT, 'No such file or directory',
                        given) from None
                partial = candidate
                f = open(fd, 'wb')
        if partial is None:
            _write_in_place(path, write)
            return
        with f:
            if old is not None:
                _keep_owner_and_mode(fd, old)
            write(f)
            f.flush()
            os.fsync(fd)
        try:
            os.replace(partial, path)
        except OSError as e:
            if not isinstance(e, PermissionError) and \
                    e.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            os.unlink(partial)
            partial = None
            _write_in_place(path, write)
            return
        partial = None
        _sync_directory(directory)
    except BaseException:
        if f is not None:
            f.close()
        if partial is not None:
            try:
                os.unlink(partial)
            except OSError:
                pass
        raise


def _write_in_place(path, write):
    with open(path, 'wb') as f:
        write(f)


def _keep_owner_and_mode(fd, old):
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except OSError:       # not ours to give away: the mode still holds
        pass
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _sync_directory(directory):
    """The rename on the disk too (best effort: not every system opens
    directories)."""
    with uninterrupted():     # opened and closed, or not opened
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
