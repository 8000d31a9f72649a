//! The API client with the kubeconfigs people really have: a proxy (`proxy-url`, `HTTPS_PROXY`,
//! `NO_PROXY`), an exec credential plugin (EKS `aws eks get-token`, GKE
//! `gke-gcloud-auth-plugin`, AKS `kubelogin`) and the OIDC auth-provider. Each runs a real
//! `collect` (lists, the kube-proxy ConfigMap, the pod lookup and websocket exec) against the
//! fake apiserver, through a small HTTP CONNECT proxy started here.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer, TOKEN};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An HTTP proxy that only tunnels (`CONNECT host:port`), as corporate proxies in front of
/// API servers do. It records the request line of every connection it gets.
struct ConnectProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl ConnectProxy {
    fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let seen = seen2.clone();
                std::thread::spawn(move || tunnel(conn, &seen));
            }
        });
        ConnectProxy { addr, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves one proxy connection: reads the request head, answers `CONNECT` with 200 and then
/// copies bytes both ways; anything else gets 405.
fn tunnel(mut client: TcpStream, seen: &Mutex<Vec<String>>) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte) {
            Ok(1) if head.len() < 16 * 1024 => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head);
    let request_line = text.lines().next().unwrap_or("").to_string();
    seen.lock().unwrap().push(request_line.clone());
    let mut parts = request_line.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (parts.next(), parts.next()) else {
        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    let Ok(upstream) = TcpStream::connect(target) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return;
    }
    let _ = client.set_read_timeout(None);
    let (Ok(mut client_read), Ok(mut upstream_write)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut upstream_write);
        let _ = upstream_write.shutdown(Shutdown::Write);
    });
    let (mut upstream_read, mut client_write) = (upstream, client);
    let _ = std::io::copy(&mut upstream_read, &mut client_write);
    let _ = client_write.shutdown(Shutdown::Write);
    let _ = up.join();
}

/// The example cluster (`testdata/cluster/`) served by the fake: its state, kube-proxy's
/// ConfigMap and a kube-proxy pod on node-1 whose `iptables-save` is the example node's dump.
fn cluster() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.add_list_file(&testdata("cluster/state.json"));
    api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[("config.conf", &read("cluster/config.yaml"))],
    );
    api.add_proxy_pod("node-1");
    api.on_exec(
        |req: &ExecRequest| match req.command.first().map(String::as_str) {
            Some("iptables-save") => ExecReply::ok(read("dumps/cluster.nft-c.save")),
            Some("ip6tables-save") => ExecReply::ok(read("dumps/cluster-v6.nft-c.save")),
            Some("ipset") => ExecReply::ok(""),
            _ => ExecReply::Missing,
        },
    );
    api
}

/// A kubeconfig with one context: `cluster_extra` and `user` are YAML lines indented under
/// `cluster:` and `user:`.
fn kubeconfig(dir: &Path, api: &FakeApiServer, cluster_extra: &str, user: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1
kind: Config
current-context: ctx
clusters:
- name: cl
  cluster:
    server: {url}
{cluster_extra}contexts:
- name: ctx
  context:
    cluster: cl
    user: me
    namespace: default
users:
- name: me
  user:
{user}",
        url = api.url()
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

fn token_user() -> String {
    format!("    token: {TOKEN}\n")
}

/// Runs `collect node-1` with `kubeconfig` and a clean environment plus `env`; returns (exit
/// code, stderr) and, on success, checks the bundle holds the node's dump.
fn collect(dir: &Path, kubeconfig: &Path, env: &[(&str, String)]) -> (i32, String) {
    let bundle = dir.join("bundle.tar.gz");
    let _ = std::fs::remove_file(&bundle);
    let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"));
    for var in [
        "KUBECONFIG",
        "KUBERNETES_SERVICE_HOST",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", dir).env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .args(["collect", "node-1", "--request-timeout", "20s", "-o"])
        .arg(&bundle)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .timeout(Duration::from_secs(90))
        .output()
        .expect("run collect");
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if code == 0 {
        let b = kproxy::collect::bundle::read(&bundle).expect("bundle");
        assert_eq!(
            b.snapshot.iptables_save.as_deref(),
            Some(read("dumps/cluster.nft-c.save").as_str()),
            "the bundle must hold the node's dump"
        );
        assert_eq!(b.state.nodes.len(), 2);
    }
    (code, stderr)
}

/// `CONNECT` lines for the fake apiserver's address.
fn connects_to(proxy: &ConnectProxy, api: &FakeApiServer) -> usize {
    let target = api.url().trim_start_matches("http://").to_string();
    let all = proxy.requests();
    assert!(
        all.iter()
            .all(|l| l == &format!("CONNECT {target} HTTP/1.1")),
        "unexpected proxy requests: {all:?}"
    );
    all.len()
}

#[test]
fn proxy_url_in_the_kubeconfig_is_used() {
    let api = cluster();
    let proxy = ConnectProxy::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = format!("    proxy-url: {}\n", proxy.url());
    let kc = kubeconfig(dir.path(), &api, &extra, &token_user());
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 0, "{stderr}");
    // Lists, the ConfigMap, the pod lookup and the exec websockets all went through it.
    assert!(connects_to(&proxy, &api) >= 1);
    assert!(!api.execs().is_empty() && !api.requests().is_empty());
}

#[test]
fn https_proxy_environment_is_used_and_no_proxy_bypasses_it() {
    let api = cluster();
    let proxy = ConnectProxy::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let kc = kubeconfig(dir.path(), &api, "", &token_user());

    // Control: without any proxy setting the proxy sees nothing.
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(connects_to(&proxy, &api), 0);

    for var in ["HTTPS_PROXY", "https_proxy"] {
        let before = connects_to(&proxy, &api);
        let (code, stderr) = collect(dir.path(), &kc, &[(var, proxy.url())]);
        assert_eq!(code, 0, "{var}: {stderr}");
        assert!(connects_to(&proxy, &api) > before, "{var} was not used");
    }

    // NO_PROXY naming the API server's host goes direct, as kubectl does.
    let before = connects_to(&proxy, &api);
    let (code, stderr) = collect(
        dir.path(),
        &kc,
        &[
            ("HTTPS_PROXY", proxy.url()),
            ("NO_PROXY", "localhost,127.0.0.1".into()),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(connects_to(&proxy, &api), before, "NO_PROXY was ignored");
}

/// A proxy that is down is an error, never a silent direct connection.
#[test]
fn unreachable_proxy_fails_without_going_direct() {
    let api = cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_url = format!("http://{}", dead.local_addr().expect("addr"));
    drop(dead);
    let kc = kubeconfig(
        dir.path(),
        &api,
        &format!("    proxy-url: {dead_url}\n"),
        &token_user(),
    );
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(!stderr.trim().is_empty());
    assert!(
        api.requests().is_empty(),
        "went around the proxy: {:?}",
        api.requests()
    );
}

/// An exec credential plugin, written the way `aws eks get-token` answers: the token comes from
/// its ExecCredential, with the kubeconfig's args and env passed.
#[test]
fn exec_credential_plugin_supplies_the_token() {
    let api = cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("plugin-calls");
    let plugin = dir.path().join("fake-get-token");
    crate::support::write_executable(
        &plugin,
        &format!(
            "#!/bin/sh\necho \"$* profile=$AWS_PROFILE\" >> '{marker}'\n\
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{TOKEN}\"}}}}'\n",
            marker = marker.display()
        ),
    );
    let user = format!(
        "    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: {}
      args: [eks, get-token, --cluster-name, demo]
      env:
      - name: AWS_PROFILE
        value: demo
      interactiveMode: Never
",
        plugin.display()
    );
    let kc = kubeconfig(dir.path(), &api, "", &user);
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 0, "{stderr}");
    let calls = std::fs::read_to_string(&marker).expect("the plugin ran");
    assert!(
        calls
            .lines()
            .all(|l| l == "eks get-token --cluster-name demo profile=demo"),
        "{calls}"
    );

    // A plugin that fails is a clear error (exit 2), not a silent anonymous request.
    std::fs::write(
        &plugin,
        "#!/bin/sh\necho 'token expired, run aws sso login' >&2\nexit 1\n",
    )
    .expect("rewrite plugin");
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 2, "{stderr}");
}

/// The OIDC auth-provider: a valid id-token is sent as the bearer token; an expired one is not
/// sent (it must be refreshed at the issuer, and this kubeconfig gives no refresh token).
#[test]
fn oidc_auth_provider_uses_a_valid_id_token_and_refuses_an_expired_one() {
    fn jwt(exp: u64) -> String {
        let enc = |s: &str| data_encoding::BASE64URL_NOPAD.encode(s.as_bytes());
        format!(
            "{}.{}.{}",
            enc(r#"{"alg":"RS256","typ":"JWT"}"#),
            enc(&format!(
                r#"{{"iss":"https://issuer.example","sub":"alice","aud":"kubernetes","exp":{exp}}}"#
            )),
            enc("signature")
        )
    }
    let api = cluster();
    let dir = tempfile::tempdir().expect("tempdir");
    let user = |token: &str| {
        format!(
            "    auth-provider:
      name: oidc
      config:
        client-id: kubernetes
        idp-issuer-url: https://issuer.example
        id-token: {token}
"
        )
    };
    let valid = jwt(4_102_444_800); // 2100-01-01
    api.accept_token(&valid);
    let kc = kubeconfig(dir.path(), &api, "", &user(&valid));
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 0, "{stderr}");

    let expired = jwt(1_000_000_000); // 2001
    api.accept_token(&expired);
    let kc = kubeconfig(dir.path(), &api, "", &user(&expired));
    let (code, stderr) = collect(dir.path(), &kc, &[]);
    assert_eq!(code, 2, "an expired id-token was used: {stderr}");
}

/// A server that accepts the connection and never answers (no TLS handshake): the command fails
/// once the handshake timeout passes, also with `--request-timeout 0` (no request timeout), as
/// kubectl does; it never waits forever.
#[test]
fn a_server_that_never_answers_the_handshake_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let held = Arc::new(Mutex::new(Vec::new()));
    let held2 = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            // Kept open, never written to.
            if let Ok(mut h) = held2.lock() {
                h.push(stream);
            }
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{addr}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .expect("kubeconfig");
    let started = std::time::Instant::now();
    let out = assert_cmd::Command::cargo_bin("kubectl-kproxy")
        .expect("binary")
        .args(["verify", "node-1", "--request-timeout", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(60))
        .output()
        .expect("run");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {stderr}");
    assert!(took >= Duration::from_secs(9), "took {took:?}: {stderr}");
    assert!(stderr.contains("TLS handshake"), "{stderr}");
    assert!(
        !held.lock().expect("held").is_empty(),
        "the server was reached"
    );
}
