"""Who a worker runs as: `--user` / `--group`, resolved once in the master
(a bad name is a bad setting: exit 2 before anything binds) and switched to
in the worker after it received its listeners and before it imports the app.

The switch, in this order (what gunicorn's and nginx's `user` do, plus the
capability and no_new_privs hardening they leave to systemd):
1. every capability dropped from the bounding set (needs CAP_SETPCAP,
   which root still has here): nothing this process or its children exec
   can get one back;
2. supplementary groups: the user's own (initgroups), or none for a bare uid;
3. setresgid, then setresuid (gid first: after the uid change we could not);
   the kernel clears the permitted and effective capabilities of a process
   whose uids all leave 0;
4. PR_SET_NO_NEW_PRIVS: no setuid binary or file capability can raise us;
5. a check that all of it holds (/proc/self/status), so a half-done switch
   fails the worker instead of serving with privileges.
The caller then sets PR_SET_PDEATHSIG again (any credential change clears
it) and checks the parent is still the master.
"""
from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass


class IdentityError(Exception):
    """A user or group that does not exist, or a switch that did not hold."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    name: str          # the user's name ('' for a bare uid with no passwd entry)


def resolve(user: str, group: str) -> Identity | None:
    """The identity for the settings, None if neither is set. A name or a
    number each; a user alone brings its primary group."""
    if not user and not group:
        return None
    name = ""
    if user:
        try:
            entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        except KeyError:
            if not user.isdigit():
                raise IdentityError(f"user = {user!r}: no such user") from None
            uid, gid = int(user), None
        else:
            uid, gid, name = entry.pw_uid, entry.pw_gid, entry.pw_name
    else:
        uid, gid = os.getuid(), None
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise IdentityError(f"group = {group!r}: no such group") from None
    if gid is None:
        gid = os.getgid() if not user else uid
    if (uid, gid) != (os.geteuid(), os.getegid()) and os.geteuid() != 0:
        key = f"user = {user!r}" if user else f"group = {group!r}"
        raise IdentityError(f"{key}: switching workers to uid {uid} gid {gid} needs root "
                            f"(the master runs as uid {os.geteuid()})")
    return Identity(uid, gid, name)


def switch(ident: Identity) -> None:
    """Becomes ident for good (see the module doc). Single-threaded callers
    only: the uid is a per-thread attribute to the kernel (glibc's setresuid
    broadcasts it, but only to threads it knows about)."""
    import prctl

    try:
        if os.geteuid() == 0:
            prctl.capbset.limit()                       # drop every capability
        if ident.name:
            os.initgroups(ident.name, ident.gid)
        else:
            os.setgroups([])
        os.setresgid(ident.gid, ident.gid, ident.gid)
        os.setresuid(ident.uid, ident.uid, ident.uid)
        prctl.set_no_new_privs(1)
    except OSError as exc:
        raise IdentityError(f"cannot switch to uid {ident.uid} gid {ident.gid}: "
                            f"{exc.strerror}") from None
    status = _status()
    problems = []
    if os.getresuid() != (ident.uid,) * 3 or os.getresgid() != (ident.gid,) * 3:
        problems.append(f"ids are {os.getresuid()} {os.getresgid()}")
    if ident.uid != 0:
        for key in ("CapPrm", "CapEff", "CapAmb"):
            if int(status.get(key, "0"), 16):
                problems.append(f"{key} = {status[key]}")
    if status.get("NoNewPrivs") != "1":
        problems.append("no_new_privs not set")
    if problems:
        raise IdentityError(f"switch to uid {ident.uid} did not hold: {', '.join(problems)}")


def _status() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
