"""``python -m gcp_storage_emulator`` with two costs taken out that real GCS does not have,
and two manners of GCS's put in.

* After every write the emulator re-serialises the metadata of every object it
  holds (indented JSON, into its own store), which it reads back only when it
  starts: loading N objects cost O(N^2), hours for a benchmark corpus. Here the
  hook only marks the object table as changed.
* Every list request scanned every object of the bucket for its prefix. Here it
  is answered from a sorted index of names, rebuilt after a change.

* Each answer goes out in one write, with ``TCP_NODELAY``: the emulator wrote
  the headers and the body separately, with Nagle on, so a body could wait for
  the peer's delayed ACK (40 ms).
* A media download carries the headers GCS's XML API sends with an object
  (``ETag``, ``Last-Modified``, ``x-goog-generation``...), which the gateway's
  XML read route passes on: clients such as obstore require them.
* An object's ``mediaLink`` and ``selfLink`` quote its name, as GCS's do: the
  emulator put the name in them as it is, so google-cloud-storage (Beam's gs://
  filesystem reads through ``mediaLink``) asked for another object, or none,
  where a name holds ``?``, ``#``, ``%`` or ``;``.

Run by path (``python emulator_main.py start ...``, the emulator's own
arguments): ``EmulatorProcess`` starts it in a scratch folder, from tests and
benchmarks alike.
"""
import base64
import bisect
import datetime
import email.utils
import sys
import urllib.parse
from http import HTTPStatus

from gcp_storage_emulator import server, storage
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.handlers import objects

changes = [0]
index = {}


def changed(self):
    changes[0] += 1


def live_candidates(self, bucket_name, prefix=None):
    objects = self.objects.get(bucket_name, {})
    version, names = index.get(bucket_name, (None, None))
    if version != changes[0]:
        names = sorted(objects)
        index[bucket_name] = (changes[0], names)
    prefix = prefix or ""
    found = []
    for i in range(bisect.bisect_left(names, prefix), len(names)):
        if not names[i].startswith(prefix):
            break
        found.append((names[i], objects[names[i]]))
    return found


def close_in_one_write(self):
    """``Response.close``: status line, headers and body in one ``sendall``."""
    handler = self._handler
    content = self._content.encode("utf-8") if isinstance(self._content, str) else self._content
    handler.send_response(self.status.value, self.status.phrase)
    for name, value in self._headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(content)))
    handler._headers_buffer.append(b"\r\n")  # what end_headers adds, before it writes
    answer = b"".join(handler._headers_buffer) + content
    handler._headers_buffer = []
    handler.wfile.write(answer)


def download_with_object_headers(request, response, storage, *args, **kwargs):
    """``objects.download``, plus the object's headers as GCS's XML API sends them."""
    original_download(request, response, storage, *args, **kwargs)
    if response.status not in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        return
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    updated = datetime.datetime.fromisoformat(obj["updated"].replace("Z", "+00:00"))
    response["ETag"] = '"{}"'.format(base64.b64decode(obj["md5Hash"]).hex())
    response["Last-Modified"] = email.utils.format_datetime(updated.astimezone(datetime.timezone.utc),
                                                            usegmt=True)
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])
    response["x-goog-stored-content-length"] = str(obj["size"])
    response["x-goog-stored-content-encoding"] = obj.get("contentEncoding") or "identity"


def object_resource_quoted(base_url, bucket_name, object_name, *args, **kwargs):
    """``objects._make_object_resource``, its links naming the object quoted, as GCS's do."""
    obj = original_object_resource(base_url, bucket_name, object_name, *args, **kwargs)
    quoted = urllib.parse.quote(object_name, safe="")
    obj["selfLink"] = f"/storage/v1/b/{bucket_name}/o/{quoted}"
    obj["mediaLink"] = f"{base_url}/download/storage/v1/b/{bucket_name}/o/{quoted}?generation={obj['generation']}&alt=media"
    return obj


original_download = objects.download
original_object_resource = objects._make_object_resource


if __name__ == "__main__":
    storage.Storage._write_config_to_file = changed
    storage.Storage._list_live_candidates = live_candidates
    server.RequestHandler.disable_nagle_algorithm = True
    server.Response.close = close_in_one_write
    objects._make_object_resource = object_resource_quoted
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original_download:
                handlers[method] = download_with_object_headers
    main(sys.argv[1:])
