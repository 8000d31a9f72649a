//! Bounded input (issue #38): every input — a file, stdin, a FIFO, a bundle, what a collector's
//! command prints — holds at most `--max-input-size` (a clear error naming the limit and the
//! input, memory bounded by the limit), a FIFO or pipe that stays silent longer than
//! `--read-timeout` is an error, and a parse error quotes a window of a long line.

use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::{cluster_file, kproxy_on_cluster};
use crate::support::{kproxy, skip};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a run of the binary left: exit status, standard error and its peak resident memory.
struct Measured {
    code: Option<i32>,
    stderr: String,
    peak_kb: u64,
    took: Duration,
}

/// Runs the binary with `args` (standard input from `stdin` when given) under python3, whose
/// `RUSAGE_CHILDREN` is the binary's own peak resident memory; `None` after [`skip`] when
/// python3 is missing.
fn measured(args: &[&str], stdin: Option<&Path>) -> Option<Measured> {
    const SCRIPT: &str = "import json, resource, subprocess, sys
stdin = open(sys.argv[1], 'rb') if sys.argv[1] else subprocess.DEVNULL
p = subprocess.run(sys.argv[2:], stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
json.dump({'code': p.returncode, 'stderr': p.stderr.decode('utf-8', 'replace'),
           'peak_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, sys.stdout)";
    let started = Instant::now();
    let out = match std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(stdin.map(Path::as_os_str).unwrap_or_default())
        .arg(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(args)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            skip("bounded input", &format!("python3 does not run: {e}"));
            return None;
        }
    };
    let took = started.elapsed();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    Some(Measured {
        code: doc["code"].as_i64().and_then(|c| i32::try_from(c).ok()),
        stderr: doc["stderr"].as_str().unwrap_or_default().to_string(),
        peak_kb: doc["peak_kb"].as_u64().unwrap_or_default(),
        took,
    })
}

#[test]
fn an_endless_input_stops_at_the_size_limit_in_bounded_memory() {
    // The default limit, 1 GiB: what /dev/zero gives is refused once the limit is read, holding
    // no more than it (4.2 GB before the limit).
    let Some(m) = measured(&["graph", "--iptables-save", "/dev/zero"], None) else {
        return;
    };
    assert_eq!(m.code, Some(2), "{}", m.stderr);
    assert!(
        m.stderr.contains(
            "/dev/zero holds more than 1 GiB, the input size limit (--max-input-size raises it)"
        ),
        "{}",
        m.stderr
    );
    assert!(m.peak_kb < 1_400_000, "peak {} KB", m.peak_kb);
    // Standard input, read by the state loader, under a smaller limit: memory follows it.
    let Some(m) = measured(
        &["render", "--state", "-", "--max-input-size", "64Mi"],
        Some(Path::new("/dev/zero")),
    ) else {
        return;
    };
    assert_eq!(m.code, Some(2), "{}", m.stderr);
    assert!(
        m.stderr.contains("<stdin> holds more than 64 MiB"),
        "{}",
        m.stderr
    );
    assert!(m.peak_kb < 250_000, "peak {} KB", m.peak_kb);
}

#[test]
fn a_file_larger_than_the_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("big.save");
    // Sparse: 8 GiB the disk does not hold.
    std::fs::File::create(&dump)
        .and_then(|f| f.set_len(8 << 30))
        .expect("sparse file");
    let Some(m) = measured(&["graph", "--iptables-save", path_str(&dump)], None) else {
        return;
    };
    assert_eq!(m.code, Some(2), "{}", m.stderr);
    assert!(m.stderr.contains("holds more than 1 GiB"), "{}", m.stderr);
    assert!(m.peak_kb < 100_000, "peak {} KB", m.peak_kb);
    assert!(m.took < Duration::from_secs(10), "{:?}", m.took);
    // Within a raised limit, a real dump reads as before.
    let ok = kproxy()
        .args(["graph", "--max-input-size", "2Gi", "--iptables-save"])
        .arg(repo("testdata/dumps/cluster.nft-c.save"))
        .output()
        .expect("run");
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let small = kproxy()
        .args(["graph", "--max-input-size", "4Ki", "--iptables-save"])
        .arg(repo("testdata/dumps/cluster.nft-c.save"))
        .output()
        .expect("run");
    assert_eq!(small.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&small.stderr).contains("holds more than 4 KiB"),
        "{small:?}"
    );
    let bad = kproxy()
        .args(["graph", "--max-input-size", "lots", "--iptables-save", "-"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("is not a size"),
        "{bad:?}"
    );
}

#[test]
fn a_fifo_that_nothing_writes_to_is_an_error_after_the_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = |name: &str| {
        let path = dir.path().join(name);
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        path
    };
    // A dump, the state, a bundle: each read the one way, each with the wait.
    let dump = fifo("dump");
    let state = fifo("state");
    let bundle = fifo("bundle");
    let cases: [(&[&str], &PathBuf); 3] = [
        (&["graph", "--iptables-save"], &dump),
        (&["render", "--state"], &state),
        (&["verify", "node-1", "--bundle"], &bundle),
    ];
    for (args, path) in cases {
        let started = Instant::now();
        let out = kproxy()
            .args(args)
            .arg(path)
            .args(["--read-timeout", "1s"])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{}: nothing to read for 1 s (a FIFO or pipe that nothing writes to?); --read-timeout sets how long to wait",
                path.display()
            )),
            "{args:?}: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{args:?}: {:?}",
            started.elapsed()
        );
    }
    // A FIFO that is written to is read as a file.
    let written = fifo("written");
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            let text = std::fs::read(repo("testdata/dumps/cluster.nft-c.save")).expect("dump");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&written)
                .expect("open fifo");
            f.write_all(&text).expect("write fifo");
        })
    };
    let out = kproxy()
        .args(["graph", "--read-timeout", "10s", "--iptables-save"])
        .arg(&written)
        .output()
        .expect("run");
    let _ = writer.join();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// One entry of a test bundle.
enum Entry<'a> {
    /// A file holding this text.
    Text(&'a str, &'a str),
    /// A file of this many zero bytes.
    Zeros(&'a str, usize),
    /// A file whose header says it holds this many bytes, followed by one block of them.
    Claims(&'a str, u64),
}

/// Writes a `.tar.gz` of `entries` (fast compression: zeros shrink a thousandfold).
fn bundle(path: &Path, entries: &[Entry<'_>]) {
    let file = std::fs::File::create(path).expect("bundle");
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    for entry in entries {
        let (name, size, data, text) = match entry {
            Entry::Text(name, text) => (*name, text.len() as u64, 0, text.as_bytes()),
            Entry::Zeros(name, n) => (*name, *n as u64, *n, &b""[..]),
            Entry::Claims(name, n) => (*name, *n, 512, &b""[..]),
        };
        let mut header = tar::Header::new_gnu();
        header.set_path(name).expect("path");
        header.set_size(size);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        gz.write_all(header.as_bytes()).expect("header");
        gz.write_all(text).expect("text");
        let zeros = vec![0u8; 1 << 20];
        let mut left = (text.len() + data).next_multiple_of(512) - text.len();
        while left > 0 {
            let n = left.min(zeros.len());
            gz.write_all(&zeros[..n]).expect("data");
            left -= n;
        }
    }
    gz.write_all(&[0u8; 1024]).expect("end of archive");
    gz.finish().expect("gzip");
}

#[test]
fn bundle_bombs_are_refused_by_size_and_by_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    const MB: usize = 1 << 20;
    let cases: Vec<(&str, Vec<Entry<'_>>, String)> = vec![
        // One entry that says it holds 20 GiB: refused by its header, nothing of it unpacked.
        (
            "claims",
            vec![Entry::Claims("kproxy-bundle/iptables-save.txt", 20 << 30)],
            "claims.tar.gz:kproxy-bundle/iptables-save.txt holds more than 64 MiB".to_string(),
        ),
        // Files each under the limit, over it together (the limit was per file).
        (
            "files",
            vec![
                Entry::Zeros("kproxy-bundle/iptables-save.txt", 30 * MB),
                Entry::Zeros("kproxy-bundle/ip6tables-save.txt", 30 * MB),
                Entry::Zeros("kproxy-bundle/conntrack.txt", 30 * MB),
            ],
            "files.tar.gz (unpacked) holds more than 64 MiB".to_string(),
        ),
        // Entries the reader skips are unpacked all the same: they count.
        (
            "skipped",
            vec![
                Entry::Zeros("elsewhere/a", 30 * MB),
                Entry::Zeros("elsewhere/b", 30 * MB),
                Entry::Zeros("elsewhere/c", 30 * MB),
            ],
            "skipped.tar.gz (unpacked) holds more than 64 MiB".to_string(),
        ),
        // Many empty entries.
        (
            "entries",
            (0..100).map(|_| Entry::Zeros("elsewhere/x", 0)).collect(),
            "more than 64 entries: not a kproxy bundle".to_string(),
        ),
    ];
    for (name, mut entries, message) in cases {
        entries.insert(
            0,
            Entry::Text(
                "kproxy-bundle/manifest.json",
                r#"{"format":1,"node":"node-1","collector":"local"}"#,
            ),
        );
        let path = dir.path().join(format!("{name}.tar.gz"));
        bundle(&path, &entries);
        let compressed = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(compressed < 1 << 20, "{name}: {compressed} bytes");
        let Some(m) = measured(
            &[
                "verify",
                "node-1",
                "--bundle",
                path_str(&path),
                "--max-input-size",
                "64Mi",
            ],
            None,
        ) else {
            return;
        };
        assert_eq!(m.code, Some(2), "{name}: {}", m.stderr);
        assert!(
            m.stderr.contains(&message),
            "{name}: {message:?} in {}",
            m.stderr
        );
        // At most the limit is held (64 MiB), whatever the archive unpacks to.
        assert!(m.peak_kb < 200_000, "{name}: peak {} KB", m.peak_kb);
    }
}

#[test]
fn a_parse_error_quotes_a_window_of_a_long_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("one-line.save");
    // A 20 MB line with an error far from both of its ends (fewer words than a rule may have:
    // see the next test; the length is a comment's).
    let mut text = String::from("*nat\n-A KUBE-SERVICES ");
    text.push_str(&"-d 10.0.0.1/32 ".repeat(1_000));
    text.push_str("--no-such-option -m comment --comment \"");
    text.push_str(&"a".repeat(20_000_000));
    text.push_str("\"\nCOMMIT\n");
    std::fs::write(&dump, &text).expect("dump");
    let out = kproxy()
        .args(["graph", "--iptables-save"])
        .arg(&dump)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        &stderr[..stderr.len().min(2000)]
    );
    assert!(stderr.len() < 2_000, "{} bytes of error", stderr.len());
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines[0].starts_with(&format!("error: {}:2:", dump.display())),
        "{stderr}"
    );
    // The caret under the column the message names, in the window shown.
    let caret = lines.iter().position(|l| l.trim_start() == "^");
    let caret = caret.unwrap_or_else(|| panic!("no caret in {stderr}"));
    let shown = lines[caret - 1];
    let at = lines[caret].find('^').unwrap_or_default();
    assert!(shown.starts_with("  …") && shown.ends_with('…'), "{shown}");
    let under: String = shown.chars().skip(at).collect();
    assert!(under.starts_with("--no-such-option"), "{stderr}");
}

#[test]
fn a_line_of_millions_of_words_is_an_error_in_bounded_memory() {
    // 60 MB of `-s ADDR` words on one rule line: each word parsed costs a few hundred bytes,
    // so reading them all took 1.5 GB; a rule has at most 4096 words (iptables-restore reads
    // 255), and the error comes at the first word past that.
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("many-words.save");
    let head = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES ";
    let mut text = String::from(head);
    text.push_str(&"-s 10.0.0.1 ".repeat(5_000_000));
    text.push_str("-j ACCEPT\nCOMMIT\n");
    std::fs::write(&dump, &text).expect("dump");
    let Some(m) = measured(&["graph", "--iptables-save", path_str(&dump)], None) else {
        return;
    };
    assert_eq!(m.code, Some(2), "{}", &m.stderr[..m.stderr.len().min(2000)]);
    // Column of the 4097th word: after "-A KUBE-SERVICES " (line 3) and 2048 `-s ADDR` pairs.
    let column = "-A KUBE-SERVICES ".len() + 2048 * "-s 10.0.0.1 ".len() + 1;
    let first = m.stderr.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!(
            "error: {}:3:{column}: expected at most 4096 words in one rule (iptables-restore reads at most 255), found `-s`",
            dump.display()
        )
    );
    assert!(m.peak_kb < 400_000, "peak {} KB", m.peak_kb);
}

#[test]
fn a_dnat_to_port_minus_one_is_an_error_not_port_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dump = dir.path().join("neg.save");
    std::fs::write(
        &dump,
        "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -d 10.96.0.1/32 -p tcp -j DNAT --to-destination 10.244.0.5:-1\nCOMMIT\n",
    )
    .expect("dump");
    let out = kproxy()
        .args([
            "trace",
            "--packet",
            "10.1.1.1->10.96.0.1:80/tcp",
            "--iptables-save",
        ])
        .arg(&dump)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(":3:63: expected a NAT port from 1 to 65535")
            && stderr.contains("found `10.244.0.5:-1`"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains(":0"));
}

/// A collector's command that prints more than the limit: `verify --collector local` inside a
/// namespace holding the example cluster's rules, with a limit below their size.
#[test]
fn a_collector_command_printing_past_the_limit_is_an_error() {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return;
    }
    let ns = Netns::new("bounded").expect("netns");
    let render = kproxy_on_cluster(&[
        "render",
        "--node",
        "node-1",
        "--with-base-jumps",
        "--nfacct",
        "none",
    ])
    .output()
    .expect("render");
    assert!(render.status.success(), "{render:?}");
    ns.restore(
        Backend::Nft,
        &String::from_utf8_lossy(&render.stdout),
        false,
    )
    .expect("restore");
    // Another program's rules make the node's `iptables-save` larger than the inputs given
    // as files (the state is 47 KB).
    let mut foreign = String::from("*filter\n:OTHER - [0:0]\n");
    for i in 0..2_000 {
        foreign.push_str(&format!(
            "-A OTHER -s 10.99.{}.{}/32 -j RETURN\n",
            i / 250,
            i % 250
        ));
    }
    foreign.push_str("COMMIT\n");
    ns.restore(Backend::Nft, &foreign, true)
        .expect("foreign rules");
    let verify = |limit: &str| {
        let mut cmd = ns.command(&[
            env!("CARGO_BIN_EXE_kubectl-kproxy"),
            "verify",
            "node-1",
            "--collector",
            "local",
            "--state",
            path_str(&cluster_file("state.json")),
            "--config",
            path_str(&cluster_file("config.yaml")),
            "--max-input-size",
            limit,
        ]);
        cmd.env("NO_COLOR", "1");
        cmd.output().expect("run")
    };
    let out = verify("64Ki");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the output of `iptables-save` on this host holds more than 64 KiB"),
        "{stderr}"
    );
    // Under the default limit the same run verifies.
    let out = verify("1Gi");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}
