"""The table of levels (ccache's ``k_remote_storage_implementations``): each URL scheme a shared
level or a remote ``dir`` may have, the backend module and class that serve it (imported by name,
only when a level is made), the packages it needs and the extra that brings them, and what
``status`` and the commands say of it. Data only, and a leaf: the settings read it on ``import jax``.
Adding a level is one row here and its own module (docs/contributing.md).
"""

from __future__ import annotations


class Row:
    """One kind of level. ``module`` and ``cls``: the backend, whose ``cls.opened(url, jax_version,
    env, team=, over_http=)`` makes it. ``form``: its URLs as messages show them. ``kind``, ``trust``,
    ``cap``: what ``status`` says of it (``team_trust``: where ``trust_shared`` is set). ``needs``:
    the top-level packages the level imports, which ``extra`` brings; ``as_dir``: those JAX's own
    cache needs to read and write it as ``dir`` (through ``etils.epath``), None where it cannot be
    one; ``proxy_session``: its fsspec filesystem reads the proxy variables only when told to.
    ``upkeep``: why ``prune --shared`` and ``clear --shared`` cannot act on it, None where they can.
    ``no_user``, ``no_query``: why a URL with ``user@`` in its host, or a query, is refused."""

    __slots__ = ("module", "cls", "form", "kind", "trust", "team_trust", "cap", "needs", "extra", "as_dir",
                 "proxy_session", "upkeep", "no_user", "no_query")

    def __init__(self, module: str, cls: str, form: str, kind: str, trust: str, cap: str, *,
                 team_trust: str | None = None, needs: tuple[str, ...] = (), extra: str | None = None,
                 as_dir: tuple[str, ...] | None = None, proxy_session: bool = False, upkeep: str | None = None,
                 no_user: str | None = None, no_query: str | None = None) -> None:
        self.module, self.cls = f"gkx_autocache._backends.{module}", cls
        self.form, self.kind, self.trust, self.cap = form, kind, trust, cap
        self.team_trust = team_trust or trust
        self.needs, self.extra, self.as_dir, self.proxy_session = needs, extra, as_dir, proxy_session
        self.upkeep, self.no_user, self.no_query = upkeep, no_user, no_query


REMOTE = "gkx-autocache[remote]"
BUCKET_TRUST = "the bucket's access policy"
PRUNED_BY_HAND = ("none: the shared level is never pruned by itself; `gkx-autocache prune --shared` or a bucket "
                  "lifecycle rule keeps it")

# s3: the level's own client (botocore's credentials), s3fs where its settings are s3fs's
S3 = Row("s3", "Deferred", "s3://bucket", "bucket", BUCKET_TRUST, PRUNED_BY_HAND, needs=("fsspec", "s3fs"),
         extra=REMOTE, as_dir=("etils", "fsspec", "s3fs"))
GS = Row("bucket", "Bucket", "gs://bucket", "bucket", BUCKET_TRUST, PRUNED_BY_HAND, needs=("fsspec", "gcsfs"),
         extra=REMOTE, as_dir=("etils", "fsspec", "gcsfs"), proxy_session=True)
HTTP = Row("http", "HttpCache", "https://", "http", "the server's access control",
           "none of the package's: the server's own, or remove the files under its root",
           upkeep="an HTTP cache, which cannot be listed: its server keeps it (remove the files under its root there)",
           no_user="credentials in the URL would be printed with it: give them in GKX_JAX_CACHE_SHARED_TOKEN or ~/.netrc",
           no_query="an HTTP cache's URL takes no query or fragment (each object's name is added to its path; a token "
                    "goes in GKX_JAX_CACHE_SHARED_TOKEN)")
# az: the Blob REST API on the package's own HTTP transport; azure-identity only for a bearer token
AZ = Row("azure", "Azure", "az://container", "bucket", "the storage account's access control", PRUNED_BY_HAND,
         no_user="the storage account is named by AZURE_STORAGE_ACCOUNT or AZURE_STORAGE_CONNECTION_STRING, not in "
                 "the URL",
         no_query="an Azure level's URL takes no query (a SAS token goes in AZURE_STORAGE_SAS_TOKEN or the connection "
                  "string, never in a setting that is shown)")

# In this order in messages ("a gs://bucket, s3://bucket, az://container or https:// URL").
SCHEMES = {"gs": GS, "s3": S3, "az": AZ, "http": HTTP, "https": HTTP}

# A path, not a URL: a team directory, or a read-only one baked into an image.
PATH = Row("directory", "Directory", "directory path", "directory", "yours or root's, no one else's", PRUNED_BY_HAND,
           team_trust="a team directory (trust_shared)")
