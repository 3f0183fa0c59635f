"""fsspec's ``storage_options`` (s3fs's, gcsfs's, adlfs's) as delta-rs takes them, per scheme; the real stores are in
tests/optim/spark/test_delta.py (S3) and tests/optim/spark/test_gcs_azure.py (GCS, Azure)."""

import json

from optim.data.delta import delta_options, delta_uri
from tests.azure_server import ACCOUNT, KEY


def test_local_tables_take_no_options():
    assert delta_options("/data/table", {"key": "k"}) is None and delta_options("file:///data/t", None) is None


def test_s3():
    assert delta_options("s3://b/t", {"endpoint_url": "http://127.0.0.1:9000", "key": "k", "secret": "s"}) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
    assert delta_options("s3a://b/t", {"client_kwargs": {"region_name": "eu-west-1"}}) == {"AWS_REGION": "eu-west-1"}


def test_gcs():
    assert delta_options("gs://b/t", {"endpoint_url": "http://127.0.0.1:4443/", "token": "anon", "project": "p"}) == {
        "google_base_url": "http://127.0.0.1:4443", "allow_http": "true", "google_skip_signature": "true"}
    account = {"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com", "private_key": "-----"}
    assert delta_options("gcs://b/t", {"token": account}) == {"google_service_account_key": json.dumps(account)}
    assert delta_options("gs://b/t", {"token": "/keys/sa.json"}) == {"google_application_credentials": "/keys/sa.json"}
    assert delta_options("gs://b/t", {"token": "google_default"}) == {} == delta_options("gs://b/t", None)
    # delta-rs reads gcs:// through another library (OpenDAL) that takes none of these options
    assert delta_uri("gcs://b/t") == "gs://b/t" and delta_uri("GCS://b/t") == "gs://b/t"
    assert delta_uri("gs://b/t") == "gs://b/t" and delta_uri("s3://b/gcs://") == "s3://b/gcs://"


def test_azure_connection_strings_and_keywords():
    emulator = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint=http://127.0.0.1:10010/{ACCOUNT};")
    assert delta_options("abfs://c/t", {"connection_string": emulator}) == {
        "azure_storage_account_name": ACCOUNT, "azure_storage_account_key": KEY,
        "azure_storage_endpoint": f"http://127.0.0.1:10010/{ACCOUNT}", "allow_http": "true"}
    cloud = "DefaultEndpointsProtocol=https;AccountName=acct;SharedAccessSignature=sv=1&sig=x;EndpointSuffix=core.windows.net"
    assert delta_options("az://c/t", {"connection_string": cloud}) == {
        "azure_storage_account_name": "acct", "azure_storage_sas_token": "sv=1&sig=x",
        "azure_storage_endpoint": "https://acct.blob.core.windows.net"}
    assert delta_options("abfss://c/t", {"connection_string": "UseDevelopmentStorage=true"}) == {
        "azure_storage_use_emulator": "true"}
    assert delta_options("abfs://c/t", {"account_name": "acct", "tenant_id": "t", "client_id": "c",
                                        "client_secret": "s"}) == {
        "azure_storage_account_name": "acct", "azure_storage_tenant_id": "t", "azure_storage_client_id": "c",
        "azure_storage_client_secret": "s"}
    assert delta_options("abfs://c/t", {"account_name": "acct", "anon": True,
                                        "account_host": "acct.blob.core.chinacloudapi.cn"}) == {
        "azure_storage_account_name": "acct", "azure_storage_endpoint": "https://acct.blob.core.chinacloudapi.cn",
        "azure_skip_signature": "true"}
