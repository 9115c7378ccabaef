#!/usr/bin/env python3
"""A Hugging Face-compatible hub on loopback for `tandem pull`'s tests (tests/test_pull.cpp).

Usage: hub_server.py ROOT PORT_FILE LOG_FILE FAULTS_FILE

ROOT holds repositories as ROOT/ORG/REPO/FILES. Two servers: the hub (its tree API and the
resolve route, which redirects to the storage server as huggingface.co redirects to its CDN)
and the storage server (the files by sha256, with range requests). PORT_FILE gets "HUB STORAGE"
once both listen; LOG_FILE a JSON line per request (server, method, path, range, whether an
Authorization header came). FAULTS_FILE (JSON, read at each request) plants faults:
  {"drop": {"ORG/REPO/FILE": N}}   the storage server closes the connection when a reply of that
                                   file reaches byte N of the file (a resumed request from N on passes)
  {"bad_sha": ["ORG/REPO/FILE"]}   the tree and the headers list a wrong sha256 for it
  {"page_size": K}                 the tree lists K entries a page (Link: rel="next")
  {"token": "T"}                   the hub wants Authorization: Bearer T (else 401)
  {"no_lfs": true}                 the tree lists no LFS oids (the sha256 is in the headers alone)
  {"fail": {"ORG/REPO/FILE": [S, N]}}  the storage server answers status S to that file's first N
                                   requests (counted over the server's life)
"""
import hashlib
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT, PORT_FILE, LOG_FILE, FAULTS_FILE = sys.argv[1:5]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
log_lock = threading.Lock()
sha_cache = {}  # path -> (mtime, size, sha256)
failed = {}  # ORG/REPO/FILE -> requests answered with a planted status


def faults():
    try:
        with open(FAULTS_FILE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def sha256_of(path):
    st = os.stat(path)
    hit = sha_cache.get(path)
    if hit and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
        return hit[2]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    sha_cache[path] = (st.st_mtime_ns, st.st_size, h.hexdigest())
    return h.hexdigest()


def listed_sha(rel):
    """The sha256 the hub lists for ORG/REPO/FILE: the true one, unless a fault says otherwise."""
    sha = sha256_of(os.path.join(ROOT, rel))
    return "f" * 64 if rel in faults().get("bad_sha", []) else sha


def by_sha(sha):
    for dirpath, _, names in os.walk(ROOT):
        for n in names:
            p = os.path.join(dirpath, n)
            if sha256_of(p) == sha:
                return p
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_name_ = "?"

    def log_message(self, *args):
        pass

    def record(self):
        entry = {"server": self.server_name_, "method": self.command, "path": self.path,
                 "range": self.headers.get("Range"), "auth": self.headers.get("Authorization") is not None}
        with log_lock, open(LOG_FILE, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def reply(self, status, body=b"", headers=None, content_type="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()


class Hub(Handler):
    server_name_ = "hub"

    def do_GET(self):
        self.record()
        token = faults().get("token")
        if token and self.headers.get("Authorization") != "Bearer " + token:
            return self.reply(401, b'{"error":"Invalid credentials"}')
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            return self.tree(parts[2] + "/" + parts[3], parts[5], urllib.parse.parse_qs(url.query))
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
        self.reply(404, b'{"error":"Repository not found"}')

    def tree(self, repo, rev, query):
        base = os.path.join(ROOT, repo)
        if rev not in ("main", COMMIT) or not os.path.isdir(base):
            return self.reply(404, b'{"error":"Repository not found"}')
        entries = []
        for dirpath, dirs, names in sorted(os.walk(base)):
            for d in sorted(dirs):
                entries.append({"type": "directory", "oid": "0" * 40,
                                "path": os.path.relpath(os.path.join(dirpath, d), base), "size": 0})
            for n in sorted(names):
                p = os.path.join(dirpath, n)
                rel = os.path.relpath(p, base)
                size = os.path.getsize(p)
                e = {"type": "file", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": size, "path": rel}
                if n.endswith(".gguf") and not faults().get("no_lfs"):  # in LFS, as the hub keeps large files
                    e["size"] = 134
                    e["lfs"] = {"oid": listed_sha(repo + "/" + rel), "size": size, "pointerSize": 134}
                entries.append(e)
        start = int(query.get("cursor", ["0"])[0])
        page = int(faults().get("page_size", 0)) or len(entries) or 1
        headers = {}
        if start + page < len(entries):
            headers["Link"] = '<http://127.0.0.1:%d/api/models/%s/tree/%s?recursive=true&cursor=%d>; rel="next"' % (
                self.server.server_port, repo, rev, start + page)
        self.reply(200, json.dumps(entries[start:start + page]).encode(), headers)

    def resolve(self, repo, rev, rel):
        p = os.path.join(ROOT, repo, rel)
        if rev not in ("main", COMMIT) or not os.path.isfile(p):
            return self.reply(404, b'{"error":"Entry not found"}')
        sha = listed_sha(repo + "/" + rel)
        headers = {"X-Repo-Commit": COMMIT, "X-Linked-Etag": '"%s"' % sha, "ETag": '"%s"' % sha,
                   "X-Linked-Size": str(os.path.getsize(p)),
                   "Location": "http://127.0.0.1:%d/blob/%s?f=%s" % (self.server.storage_port,
                                                                      sha256_of(p), urllib.parse.quote(repo + "/" + rel))}
        self.reply(302, b"", headers)


class Storage(Handler):
    server_name_ = "storage"

    def do_GET(self):
        self.record()
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        p = by_sha(parts[1]) if len(parts) == 2 and parts[0] == "blob" else None
        if not p:
            return self.reply(404, b"no such blob", content_type="text/plain")
        rel = urllib.parse.parse_qs(url.query).get("f", [""])[0]
        size = os.path.getsize(p)
        start, status, headers = 0, 200, {"Accept-Ranges": "bytes", "ETag": '"%s"' % parts[1]}
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= size:
                return self.reply(416, b"", {"Content-Range": "bytes */%d" % size}, "text/plain")
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, size - 1, size)
        fail = faults().get("fail", {}).get(rel)
        if fail and failed.get(rel, 0) < fail[1]:
            failed[rel] = failed.get(rel, 0) + 1
            return self.reply(int(fail[0]), b"busy", {"Retry-After": "1"}, "text/plain")
        drop = faults().get("drop", {}).get(rel)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(p, "rb") as f:
            f.seek(start)
            pos = start
            while pos < size:
                n = min(65536, size - pos)
                if drop is not None and pos < drop <= pos + n:
                    self.wfile.write(f.read(drop - pos))
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)  # the connection drops half-way
                    return
                self.wfile.write(f.read(n))
                pos += n


def main():
    storage = ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    hub.storage_port = storage.server_port
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write("%d %d\n" % (hub.server_port, storage.server_port))
    os.rename(PORT_FILE + ".tmp", PORT_FILE)
    hub.serve_forever()


if __name__ == "__main__":
    main()
