//! Running `ipvsadm`, `ipset` and `ip` on this host (optionally inside a named network namespace),
//! through [`crate::apply::host::run_local`].
//! Commands are argv vectors, never shell strings; `ipset restore` input goes through stdin.

use crate::apply::host::{HostError, run_local};

/// The IPVS tools of this host.
#[derive(Debug, Clone, Default)]
pub struct IpvsTools {
    /// Run inside this network namespace (`ip netns exec NAME …`).
    pub netns: Option<String>,
}

impl IpvsTools {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, HostError> {
        run_local(self.netns.as_deref(), program, args, stdin)
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
