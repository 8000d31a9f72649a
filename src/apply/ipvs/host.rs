//! Running `ipvsadm`, `ipset` and `ip` on this host (optionally inside a named network namespace).
//! Commands are argv vectors, never shell strings; `ipset restore` input goes through stdin.

use crate::apply::host::HostError;
use std::io::Write;
use std::process::{Command, Stdio};

/// The IPVS tools of this host.
#[derive(Debug, Clone, Default)]
pub struct IpvsTools {
    /// Run inside this network namespace (`ip netns exec NAME …`).
    pub netns: Option<String>,
}

impl IpvsTools {
    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, HostError> {
        let mut cmd = self.command(program);
        cmd.args(args);
        run(cmd, program, stdin)
    }

    /// `ipvsadm -Ln` (connection counters) followed by `ipvsadm -Sn` (every attribute; what
    /// `ipvsadm-save -n` prints), as one text [`super::state::IpvsState::from_dumps`] reads.
    pub fn ipvsadm_dump(&self) -> Result<(String, String), HostError> {
        let list = self.run("ipvsadm", &["-Ln"], None)?;
        let save = self.run("ipvsadm", &["-Sn"], None)?;
        Ok((list, save))
    }

    /// `ipset save`.
    pub fn ipset_save(&self) -> Result<String, HostError> {
        self.run("ipset", &["save"], None)
    }

    /// `ip -o addr show dev kube-ipvs0`, or `None` when the device does not exist.
    pub fn kube_ipvs0(&self) -> Result<Option<String>, HostError> {
        match self.run("ip", &["-o", "addr", "show", "dev", "kube-ipvs0"], None) {
            Ok(t) => Ok(Some(t)),
            Err(HostError::Failed { stderr, .. })
                if stderr.contains("does not exist") || stderr.contains("Cannot find device") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// One `ipvsadm` command.
    pub fn ipvsadm(&self, args: &[String]) -> Result<(), HostError> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("ipvsadm", &a, None).map(|_| ())
    }

    /// `ipset restore -exist` of `input`.
    pub fn ipset_restore(&self, input: &str) -> Result<(), HostError> {
        self.run("ipset", &["restore", "-exist"], Some(input))
            .map(|_| ())
    }

    /// One `ip` command.
    pub fn ip(&self, args: &[String]) -> Result<(), HostError> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("ip", &a, None).map(|_| ())
    }
}

fn run(mut cmd: Command, program: &str, stdin: Option<&str>) -> Result<String, HostError> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let spawn_err = |source| HostError::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A failing restore may close stdin early; its exit status reports the real error.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(HostError::Failed {
            program: program.to_string(),
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
