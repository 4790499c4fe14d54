"""What version of each file the store holds now, from one listing per directory.

A version is a small dict: ``{"etag": ...}`` and/or ``{"size": ..., "mtime": ...}``, whatever the
store's listing gives (S3 and GCS list ETags; local and most filesystems size and modification
time). Two versions are the same when every field they both have is equal.

Plain HTTP servers list a directory as an HTML page; turbotrain reads nginx- and Apache-style
index pages, which give each file's size and its modification time to the minute. A change within
the same minute and at the same size would not show there, so a file whose listed minute is
recent (within two minutes of now), or whose entry was recorded that way, is confirmed with one
HEAD request for its ETag. Files missing from a listing, or in a directory that cannot be listed,
are asked for one by one the same way.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from .fetch import Fetcher, scheme_of

__all__ = ["listed_versions", "same_version"]

log = logging.getLogger("turbotrain")

_RECENT_S = 120.0
# nginx: <a href="f.bin">f.bin</a>    24-Nov-2026 08:01    1024
# Apache: <a href="f.bin">f.bin</a></td><td align="right">2026-11-24 08:01  </td><td align="right">1024</td>
_ROW = re.compile(
    r'<a href="(?P<href>[^"?/]+)">[^<]*</a>(?:\s|<[^>]*>)*'
    r"(?P<date>\d{2}-[A-Za-z]{3}-\d{4} \d{2}:\d{2}|\d{4}-\d{2}-\d{2} \d{2}:\d{2})"
    r"(?:\s|<[^>]*>)*(?P<size>\d+)\b"
)
_DATE_FORMATS = ("%d-%b-%Y %H:%M", "%Y-%m-%d %H:%M")


def same_version(recorded: Any, now: Any) -> bool:
    """Whether two versions describe the same file (every field both carry is equal)."""
    if not isinstance(recorded, dict) or not isinstance(now, dict):
        return False
    common = set(recorded) & set(now)
    return bool(common) and all(recorded[k] == now[k] for k in common)


def _from_info(info: dict[str, Any]) -> dict[str, Any] | None:
    version: dict[str, Any] = {}
    for key in ("ETag", "etag", "e_tag", "md5Hash", "ETAG"):
        if info.get(key):
            version["etag"] = str(info[key]).strip('"')
            break
    if "etag" not in version:
        for key in ("mtime", "LastModified", "last_modified", "Last-Modified", "updated", "modified", "created"):
            if info.get(key) is not None:
                value = info[key]
                version["mtime"] = value.isoformat() if hasattr(value, "isoformat") else str(value)
                break
    if info.get("size") is not None:
        version["size"] = int(info["size"])
    return version or None


def _minute_is_recent(text: str) -> bool:
    for fmt in _DATE_FORMATS:
        try:
            when = datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
        return when >= time.time() - _RECENT_S
    return True


def _http_listing(directory: str, fetcher: Fetcher) -> dict[str, dict[str, Any]]:
    page = fetcher.read(directory.rstrip("/") + "/").decode(errors="replace")
    out = {}
    for row in _ROW.finditer(page):
        out[row["href"]] = {"size": int(row["size"]), "modified": row["date"], "recent": _minute_is_recent(row["date"])}
    return out


def _listing(directory: str, fetcher: Fetcher) -> Mapping[str, dict[str, Any] | None] | None:
    """File name -> version (None when the listing says nothing of it) for one directory, or None when it
    cannot be listed."""
    try:
        if scheme_of(directory) in ("http", "https"):
            return _http_listing(directory, fetcher)
        fs, path = fetcher.filesystem(directory)
        fs.invalidate_cache(path)  # a listing fsspec kept from earlier in this process may be stale
        return {
            str(info["name"]).rstrip("/").rsplit("/", 1)[-1]: _from_info(info)
            for info in fs.ls(path, detail=True)
            if info.get("type", "file") != "directory"
        }
    except Exception as exc:  # noqa: BLE001 - a store that cannot list: ask file by file instead
        log.debug("turbotrain: cannot list %s (%s); checking its files one by one", directory, exc)
        return None


def _one(url: str, fetcher: Fetcher) -> dict[str, Any] | None:
    try:
        fs, path = fetcher.filesystem(url)
        return _from_info(fs.info(path))
    except FileNotFoundError:
        return None  # gone: the dataset's read will name it
    except Exception as exc:  # noqa: BLE001 - unknown version: the entry is fetched again
        log.debug("turbotrain: cannot read the version of %s (%s)", url, exc)
        return None


def _confirmed_at_record(recorded: Any) -> bool:
    """An HTTP entry recorded while its listed minute was recent: its ETag must be compared again."""
    return isinstance(recorded, dict) and "modified" in recorded and "etag" in recorded


def listed_versions(
    urls: list[str], fetcher: Fetcher, recorded: Callable[[str], Any] = lambda url: None
) -> dict[str, Any]:
    """URL -> its version now (None when unknown), with one listing per directory.

    ``recorded(url)`` is the version a cache holds for ``url``: an HTTP entry confirmed by HEAD
    when it was recorded is confirmed by HEAD again.
    """
    by_dir: dict[str, list[str]] = defaultdict(list)
    for url in dict.fromkeys(urls):
        by_dir[url.rsplit("/", 1)[0] if "/" in url else "."].append(url)
    dirs = list(by_dir)
    listings = list(fetcher.pool().map(lambda d: _listing(d, fetcher), dirs))
    versions: dict[str, Any] = {}
    ask: list[str] = []
    for directory, listing in zip(dirs, listings):
        for url in by_dir[directory]:
            found = (listing or {}).get(url.rsplit("/", 1)[-1])
            if found is not None and found.pop("recent", False) is False and not _confirmed_at_record(recorded(url)):
                versions[url] = found
            else:
                versions[url] = found
                ask.append(url)
    for url, precise in zip(ask, fetcher.pool().map(lambda u: _one(u, fetcher), ask)):
        if precise is None:
            versions[url] = None
        else:
            versions[url] = {**(versions[url] or {}), **precise}
    return versions
