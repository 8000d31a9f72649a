//! The IPVS-mode repair transaction: read the node (ipvsadm, ipset, kube-ipvs0, iptables), plan,
//! check the plan against kube-proxy's allow-list ([`crate::apply::allow::check_ipvs_plan`]),
//! back up (and rotate old backups), apply step by step, read back and re-plan; on any failure
//! put back what was changed: a rollback plan from the node's state then to the backed-up one
//! for the virtual servers, sets and `kube-ipvs0` addresses the repair touched, and the
//! iptables chains it changed ([`crate::apply::iptables::rollback`]).

use super::changes::Ipvs0Change;
use super::host::IpvsTools;
use super::plan::{IpvsPlan, Ownership, plan, rollback_plan};
use super::state::{Ipvs0, Ipvs0Text, IpvsState};
use crate::apply::allow::check_ipvs_plan;
use crate::apply::backup::{new_backup_dir, rollback_file, write_backup, write_private};
use crate::apply::host::HostError;
use crate::apply::iptables::host::{IptablesHost, RulesHost};
use crate::apply::iptables::plan::TablePlan;
use crate::apply::iptables::rollback::roll_back as roll_back_chains;
use crate::apply::transaction::Rotation;
use crate::apply::transaction::{RollbackOutcome, RollbackPolicy, RolledBack};
use crate::compare::ipvs::{left_out_address, left_out_virtual_server, loopback_member};
use crate::compare::left_out::{LeftOutService, NotChecked, tally};
use crate::model::Ruleset;
use crate::proxier::ipvs::{ExpectedIpvs, iptables::JUMPS};
use crate::state::ip::IpFamily;
use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::ParseOptions;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of an IPVS repair. Every variant says whether the node was restored.
#[derive(Debug, thiserror::Error)]
pub enum IpvsRepairError {
    /// Reading the node failed; nothing was changed.
    #[error("reading the node's state: {0}")]
    Read(HostError),
    /// A dump could not be parsed; nothing was changed.
    #[error("parsing the node's {what}: {error}")]
    Parse {
        /// Which dump.
        what: &'static str,
        /// The parse error.
        error: ParseError,
    },
    /// The backup could not be written; nothing was changed.
    #[error("writing the backup to {dir}: {error}")]
    Backup {
        /// Backup directory.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A step failed; what was changed was put back (or putting it back failed, see `rollback`).
    #[error("{step} failed: {error}; {}", rollback_text(rollback, backup))]
    Apply {
        /// The step (command) that failed.
        step: String,
        /// The error.
        error: Box<HostError>,
        /// The backup directory.
        backup: PathBuf,
        /// What the rollback left as it is (and why), or why restoring failed.
        rollback: RollbackOutcome,
    },
    /// The state read back after applying still differs; what was changed was put back.
    #[error(
        "after applying, the node still differs ({remaining}); {}",
        rollback_text(rollback, backup)
    )]
    Verify {
        /// Summary of what still differs.
        remaining: String,
        /// The backup directory.
        backup: PathBuf,
        /// What the rollback left as it is (and why), or why restoring failed.
        rollback: RollbackOutcome,
    },
}

fn rollback_text(rollback: &RollbackOutcome, backup: &Path) -> String {
    match rollback {
        Ok(r) if r.notes.is_empty() => format!(
            "the node was restored to its state before the repair (backup {})",
            backup.display()
        ),
        Ok(r) => format!(
            "what the repair changed was restored from the backup {}, except: {}",
            backup.display(),
            r.notes.join("; ")
        ),
        Err(e) => format!(
            "RESTORING THE NODE FAILED TOO ({e}); the state before the repair is in {}",
            backup.display()
        ),
    }
}

/// What kube-proxy should have on the node, ready to plan against.
#[derive(Debug, Clone)]
pub struct IpvsTarget {
    /// The render of one family.
    pub expected: ExpectedIpvs,
    /// The expected state in repair form.
    pub state: IpvsState,
    /// The IPVS-mode iptables payload with the jumps from the built-in chains.
    pub iptables_text: String,
    /// The node's addresses (from the node facts), for NodePort virtual server ownership.
    pub node_addrs: BTreeSet<IpAddr>,
    /// The Services whose API object was left out as invalid: what of theirs the node holds
    /// (virtual servers, set members, `kube-ipvs0` addresses, iptables rules) is left as it is.
    pub left_out: Vec<LeftOutService>,
}

impl IpvsTarget {
    /// Prepares the render for planning.
    pub fn new(expected: ExpectedIpvs, node_addrs: &[IpAddr]) -> IpvsTarget {
        let state = IpvsState::expected(&expected);
        let iptables_text = with_jumps(&expected.iptables);
        let mut addrs: BTreeSet<IpAddr> = node_addrs.iter().copied().collect();
        addrs.extend(expected.node_port_ips.iter().copied());
        IpvsTarget {
            expected,
            state,
            iptables_text,
            node_addrs: addrs,
            left_out: Vec::new(),
        }
    }

    /// What belongs to kube-proxy given the node's `current` state.
    pub fn ownership(&self, current: &IpvsState) -> Ownership {
        let mut service_addrs: BTreeSet<IpAddr> =
            self.expected.kube_ipvs0_addresses.iter().copied().collect();
        if let Ipvs0::Present(a) = &current.kube_ipvs0 {
            service_addrs.extend(a.iter().copied());
        }
        Ownership {
            family: self.expected.ip_family,
            exclude_cidrs: self.expected.exclude_cidrs.clone(),
            service_addrs,
            node_addrs: self.node_addrs.clone(),
        }
    }

    /// The plan from the node's `current` state and iptables rules (`current_text`, parsed as
    /// `current_rules`) to this target. What the node holds of the Services in
    /// [`IpvsTarget::left_out`] is kept: the plan neither deletes nor changes it.
    pub fn plan(
        &self,
        current: &IpvsState,
        current_text: &str,
        current_rules: &Ruleset<'_>,
    ) -> Result<IpvsPlan, ParseError> {
        let (iptables_text, mut left_alone) = crate::compare::iptables::scope::keep_left_out(
            &self.iptables_text,
            current_text,
            &self.left_out,
        );
        let expected_rules = Ruleset::parse(&iptables_text, &ParseOptions::default())?;
        let mut ipt = crate::apply::iptables::plan::plan(&expected_rules, current_rules, false);
        let desired = self.with_left_out(current, &mut left_alone);
        ipt.left_alone = left_alone;
        Ok(plan(&desired, current, &self.ownership(current), ipt))
    }

    /// The expected state with `current`'s objects of the left-out Services in it, counted
    /// into `left_alone`.
    fn with_left_out(
        &self,
        current: &IpvsState,
        left_alone: &mut Vec<NotChecked>,
    ) -> std::borrow::Cow<'_, IpvsState> {
        if self.left_out.is_empty() {
            return std::borrow::Cow::Borrowed(&self.state);
        }
        let mut count = |l: &LeftOutService| {
            tally(
                left_alone,
                NotChecked {
                    service: l.service.clone(),
                    chains: 0,
                    objects: 1,
                },
            );
        };
        let mut desired = self.state.clone();
        // The hairpin members of the left-out virtual servers' endpoints are theirs too.
        let mut loopback: BTreeMap<String, &LeftOutService> = BTreeMap::new();
        for (key, vs) in &current.virtual_servers {
            let (protocol, addr, port) = key;
            if let Some(l) = left_out_virtual_server(&self.left_out, protocol.as_str(), addr, *port)
            {
                desired.virtual_servers.insert(*key, vs.clone());
                count(l);
                for (ip, port) in vs.real_servers.keys() {
                    loopback.insert(loopback_member(protocol.as_str(), ip, *port), l);
                }
            }
        }
        if let (Some(want), Some(have)) = (&mut desired.sets, &current.sets) {
            for (name, set) in have {
                let Some(wanted) = want.get_mut(name) else {
                    continue;
                };
                for (canonical, text) in &set.members {
                    let address = canonical.split(',').next().unwrap_or("");
                    let hairpin = loopback.get(canonical.as_str()).copied();
                    if let Some(l) = hairpin.or_else(|| left_out_address(&self.left_out, address)) {
                        wanted.members.insert(canonical.clone(), text.clone());
                        count(l);
                    }
                }
            }
        }
        if let (Ipvs0::Present(want), Ipvs0::Present(have)) =
            (&mut desired.kube_ipvs0, &current.kube_ipvs0)
        {
            for a in have {
                if let Some(l) = left_out_address(&self.left_out, &a.to_string()) {
                    want.insert(*a);
                    count(l);
                }
            }
        }
        std::borrow::Cow::Owned(desired)
    }
}

/// The payload plus `:CHAIN` declarations of the built-in chains and the jumps kube-proxy
/// prepends to them (in the order repeated prepending leaves them).
pub fn with_jumps(payload: &str) -> String {
    let mut out = String::new();
    let mut table = String::new();
    for line in payload.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
            out.push_str(line);
            out.push('\n');
            let mut declared = HashSet::new();
            for (tb, from, _, _) in JUMPS {
                if *tb == table && declared.insert(*from) {
                    out.push_str(&format!(":{from} ACCEPT [0:0]\n"));
                }
            }
            continue;
        }
        if line.contains(" -m ipvs ") {
            out.push_str(&ipvs_match_as_saved(line));
            out.push('\n');
            continue;
        }
        if line == "COMMIT" {
            for (tb, from, to, comment) in JUMPS.iter().rev() {
                if *tb == table {
                    out.push_str(&format!(
                        "-A {from} -m comment --comment \"{comment}\" -j {to}\n"
                    ));
                }
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Writes the options of an `-m ipvs` match the way `iptables-save` prints them (`--vproto` as a
/// number, then `--vaddr`, `--vport`), so that the written rule and the one read back compare
/// equal (the rule model keeps the extension's options as given).
fn ipvs_match_as_saved(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let Some(at) = words.windows(2).position(|w| w == ["-m", "ipvs"]) else {
        return line.to_string();
    };
    let start = at + 2;
    let mut end = start;
    let mut opts: Vec<(&str, String)> = Vec::new();
    while let (Some(k), Some(v)) = (words.get(end), words.get(end + 1)) {
        if !k.starts_with("--v") {
            break;
        }
        let v = match (*k, *v) {
            ("--vproto", "tcp") => "6".to_string(),
            ("--vproto", "udp") => "17".to_string(),
            ("--vproto", "sctp") => "132".to_string(),
            (_, v) => v.to_string(),
        };
        opts.push((k, v));
        end += 2;
    }
    let rank = |k: &str| match k {
        "--vproto" => 0,
        "--vaddr" => 1,
        "--vport" => 2,
        _ => 3,
    };
    opts.sort_by_key(|(k, _)| rank(k));
    let mut out: Vec<String> = words[..start].iter().map(|w| w.to_string()).collect();
    for (k, v) in opts {
        out.push(k.to_string());
        out.push(v);
    }
    out.extend(words[end..].iter().map(|w| w.to_string()));
    out.join(" ")
}

/// Everything read from the node before a change (and written to the backup).
#[derive(Debug, Clone)]
pub struct IpvsSnapshot {
    /// `ipvsadm -Ln`.
    pub ipvsadm_list: String,
    /// `ipvsadm -Sn` (= `ipvsadm-save -n`).
    pub ipvsadm_save: String,
    /// `ipset save`.
    pub ipset_save: String,
    /// `ip -o addr show dev kube-ipvs0`, `None` when the device does not exist.
    pub kube_ipvs0: Option<String>,
    /// `iptables-save` (with counters when taken for the backup).
    pub iptables_save: String,
}

impl IpvsSnapshot {
    /// Reads the node.
    pub fn read(
        tools: &IpvsTools,
        ipt: &IptablesHost,
        counters: bool,
    ) -> Result<IpvsSnapshot, IpvsRepairError> {
        let (ipvsadm_list, ipvsadm_save) = tools.ipvsadm_dump().map_err(IpvsRepairError::Read)?;
        Ok(IpvsSnapshot {
            ipvsadm_list,
            ipvsadm_save,
            ipset_save: tools.ipset_save().map_err(IpvsRepairError::Read)?,
            kube_ipvs0: tools.kube_ipvs0().map_err(IpvsRepairError::Read)?,
            iptables_save: ipt.save(counters).map_err(IpvsRepairError::Read)?,
        })
    }

    /// The IPVS state it shows.
    pub fn state(&self) -> Result<IpvsState, IpvsRepairError> {
        let ipvsadm = format!("{}\n{}", self.ipvsadm_list, self.ipvsadm_save);
        let ipvs0 = match &self.kube_ipvs0 {
            Some(t) => Ipvs0Text::Addr(t),
            None => Ipvs0Text::Absent,
        };
        IpvsState::from_dumps(&ipvsadm, Some(&self.ipset_save), ipvs0).map_err(|error| {
            IpvsRepairError::Parse {
                what: "ipvsadm/ipset dumps",
                error,
            }
        })
    }

    /// The iptables rules it shows.
    pub fn rules(&self) -> Result<Ruleset<'_>, IpvsRepairError> {
        Ruleset::parse(&self.iptables_save, &ParseOptions::default()).map_err(|error| {
            IpvsRepairError::Parse {
                what: "iptables rules",
                error,
            }
        })
    }
}

/// What to do.
#[derive(Debug, Clone)]
pub struct IpvsRepairOptions {
    /// Change the node (otherwise only plan).
    pub apply: bool,
    /// Where backups go.
    pub backup_dir: PathBuf,
    /// How many backups of the node to keep (older ones are removed; 0 keeps all).
    pub keep_backups: usize,
    /// Node name (for the backup's name).
    pub node: String,
    /// The xtables lock wait and retries of the iptables part of a rollback.
    pub rollback: RollbackPolicy,
    /// Test only: run a failing `ipvsadm` command after every step, to prove the rollback.
    pub inject_fault: bool,
}

/// The result of a repair.
#[derive(Debug)]
pub struct IpvsRepairReport {
    /// The plan computed from the node's state before any change.
    pub plan: IpvsPlan,
    /// The backup directory, when something was applied.
    pub backup: Option<PathBuf>,
    /// Old backups removed to keep the newest `keep_backups`.
    pub rotation: Rotation,
    /// Whether the plan was applied and verified.
    pub applied: bool,
    /// Commands run to apply (ipvsadm, ip, ipset restore, iptables-restore).
    pub commands: usize,
    /// Time spent applying.
    pub apply_time: Duration,
    /// Time spent reading back and re-planning.
    pub verify_time: Duration,
}

/// Plans (and with `opts.apply`, applies) the change from the node's state to `target`.
/// `before_apply` sees the node's state, rules and the plan and may veto with refusals.
pub fn repair(
    tools: &IpvsTools,
    ipt: &IptablesHost,
    target: &IpvsTarget,
    opts: &IpvsRepairOptions,
    before_apply: impl FnOnce(&IpvsState, &Ruleset<'_>, &IpvsPlan) -> Vec<String>,
) -> Result<(IpvsRepairReport, Vec<String>), IpvsRepairError> {
    let snap = IpvsSnapshot::read(tools, ipt, true)?;
    let current = snap.state()?;
    let rules = snap.rules()?;
    let the_plan = target
        .plan(&current, &snap.iptables_save, &rules)
        .map_err(|error| IpvsRepairError::Parse {
            what: "expected iptables rules",
            error,
        })?;
    let mut refusals = before_apply(&current, &rules, &the_plan);
    // Whatever the render asked for, only kube-proxy's objects are changed (not even --force
    // lifts this).
    refusals.extend(check_ipvs_plan(
        &the_plan,
        &target.state,
        &target.ownership(&current),
    ));
    let mut report = IpvsRepairReport {
        plan: the_plan,
        backup: None,
        rotation: Rotation::default(),
        applied: false,
        commands: 0,
        apply_time: Duration::ZERO,
        verify_time: Duration::ZERO,
    };
    if !opts.apply || report.plan.is_empty() || !refusals.is_empty() {
        return Ok((report, refusals));
    }
    let backup =
        write_snapshot(&opts.backup_dir, &opts.node, ipt.ipv6, &snap).map_err(|error| {
            IpvsRepairError::Backup {
                dir: opts.backup_dir.clone(),
                error,
            }
        })?;
    report.backup = Some(backup.clone());
    report.rotation = Rotation::run(&opts.backup_dir, &opts.node, opts.keep_backups);
    let started = Instant::now();
    let mut exec = Exec {
        tools,
        ipt,
        commands: 0,
        tables_applied: 0,
        inject_fault: opts.inject_fault,
    };
    let undo = |exec: &Exec<'_>| Undo {
        snap: &snap,
        saved: &current,
        forward: &report.plan,
        tables_applied: exec.tables_applied,
        policy: &opts.rollback,
        backup: &backup,
    };
    if let Err((step, error)) = exec.apply(&report.plan, true) {
        let rollback = roll_back(tools, ipt, &undo(&exec));
        return Err(IpvsRepairError::Apply {
            step,
            error: Box::new(error),
            backup,
            rollback,
        });
    }
    report.commands = exec.commands;
    report.apply_time = started.elapsed();
    let verify_started = Instant::now();
    let after = IpvsSnapshot::read(tools, ipt, false)?;
    let again = target
        .plan(&after.state()?, &after.iptables_save, &after.rules()?)
        .map_err(|error| IpvsRepairError::Parse {
            what: "expected iptables rules",
            error,
        })?;
    report.verify_time = verify_started.elapsed();
    if !again.is_empty() {
        let rollback = roll_back(tools, ipt, &undo(&exec));
        return Err(IpvsRepairError::Verify {
            remaining: again.summary(),
            backup,
            rollback,
        });
    }
    report.applied = true;
    Ok((report, refusals))
}

/// Runs plan steps in order.
struct Exec<'a> {
    tools: &'a IpvsTools,
    ipt: &'a IptablesHost,
    commands: usize,
    /// iptables tables of the plan restored so far (in plan order).
    tables_applied: usize,
    inject_fault: bool,
}

type StepError = (String, HostError);

impl Exec<'_> {
    /// Applies `p`. `forward` re-checks set references before destroying and writes the iptables
    /// plan; a rollback plan has no iptables part (the caller restores the saved rules in between).
    fn apply(&mut self, p: &IpvsPlan, forward: bool) -> Result<(), StepError> {
        self.first_half(p)?;
        if forward {
            for t in p.iptables.tables.iter().filter(|t| !t.is_empty()) {
                self.step(
                    format!("iptables-restore --noflush (table {})", t.table),
                    |s| s.ipt.restore_noflush(&t.restore_input()),
                )?;
                self.tables_applied += 1;
            }
        }
        self.second_half(p, forward)
    }

    fn first_half(&mut self, p: &IpvsPlan) -> Result<(), StepError> {
        let input = p.ipset_input();
        if !input.is_empty() {
            self.step("ipset restore -exist".into(), |s| {
                s.tools.ipset_restore(&input)
            })?;
        }
        self.ip_steps(&p.ipvs0_add)?;
        for c in &p.ipvs {
            self.step(c.command(), |s| s.tools.ipvsadm(&c.argv()))?;
        }
        Ok(())
    }

    fn second_half(&mut self, p: &IpvsPlan, forward: bool) -> Result<(), StepError> {
        let input = p.destroy_input();
        if !input.is_empty() {
            self.step(
                "ipset restore -exist (destroy the sets the repair created)".into(),
                |s| s.tools.ipset_restore(&input),
            )?;
        }
        self.ip_steps(&p.ipvs0_del)?;
        if forward && self.inject_fault {
            let argv: Vec<String> = ["-d", "-t", "192.0.2.255:1", "-r", "192.0.2.254:1"]
                .map(String::from)
                .into();
            self.step("ipvsadm (injected fault)".into(), |s| {
                s.tools.ipvsadm(&argv)
            })?;
        }
        Ok(())
    }

    fn ip_steps(&mut self, changes: &[Ipvs0Change]) -> Result<(), StepError> {
        for c in changes {
            self.step(c.command(), |s| s.tools.ip(&c.argv()))?;
        }
        Ok(())
    }

    fn step(
        &mut self,
        name: String,
        f: impl FnOnce(&Self) -> Result<(), HostError>,
    ) -> Result<(), StepError> {
        self.commands += 1;
        f(self).map_err(|e| (name, e))
    }
}

/// What a rollback puts back: the snapshot taken before the repair (and its IPVS state), the
/// plan that ran, how many of its iptables tables were restored, and where the backup is.
struct Undo<'a> {
    snap: &'a IpvsSnapshot,
    saved: &'a IpvsState,
    forward: &'a IpvsPlan,
    tables_applied: usize,
    policy: &'a RollbackPolicy,
    backup: &'a Path,
}

/// Puts back what `u.forward` changed: the sets, kube-ipvs0 and virtual servers it touched (a
/// plan from the node's state now to the snapshot's) and the iptables chains it changed in the
/// tables it restored — of each, only what still holds what the repair wrote. Returns what was
/// left as it is, and why, or why putting back failed.
fn roll_back(tools: &IpvsTools, ipt: &IptablesHost, u: &Undo<'_>) -> RollbackOutcome {
    let family = if ipt.ipv6 { IpFamily::V6 } else { IpFamily::V4 };
    let now = IpvsSnapshot::read(tools, ipt, false)
        .and_then(|s| s.state())
        .map_err(|e| e.to_string())?;
    let back = rollback_plan(u.saved, &now, u.forward, family);
    let mut exec = Exec {
        tools,
        ipt,
        commands: 0,
        tables_applied: 0,
        inject_fault: false,
    };
    let mut errors = Vec::new();
    if let Err((step, e)) = exec.first_half(&back) {
        errors.push(format!("{step}: {e}"));
    }
    let applied: Vec<&TablePlan> = u
        .forward
        .iptables
        .tables
        .iter()
        .filter(|t| !t.is_empty())
        .take(u.tables_applied)
        .collect();
    let file = rollback_file(u.backup, "iptables");
    let mut notes = back.kept.clone();
    match roll_back_chains(ipt, &u.snap.iptables_save, &applied, u.policy, &file) {
        Ok(done) => notes.extend(done.notes),
        Err(e) => errors.push(format!("putting back the iptables chains: {e}")),
    }
    if let Err((step, e)) = exec.second_half(&back, false) {
        errors.push(format!("{step}: {e}"));
    }
    if errors.is_empty() {
        Ok(RolledBack { attempts: 1, notes })
    } else {
        Err(errors.join("; "))
    }
}

/// Writes the snapshot into a new directory `DIR/NODE-ipvs-STAMP/` (files mode 0600): the
/// iptables-save text (restorable with `iptables-restore`), `ipvsadm-save.txt`, `ipvsadm-list.txt`,
/// `ipset-save.txt`, `kube-ipvs0.txt`.
fn write_snapshot(
    dir: &Path,
    node: &str,
    ipv6: bool,
    snap: &IpvsSnapshot,
) -> std::io::Result<PathBuf> {
    let sub = new_backup_dir(dir, node, "ipvs")?;
    write_backup(&sub, node, ipv6, &snap.iptables_save)?;
    let files = [
        ("ipvsadm-save.txt", snap.ipvsadm_save.as_str()),
        ("ipvsadm-list.txt", snap.ipvsadm_list.as_str()),
        ("ipset-save.txt", snap.ipset_save.as_str()),
        (
            "kube-ipvs0.txt",
            snap.kube_ipvs0.as_deref().unwrap_or("(device absent)\n"),
        ),
    ];
    for (name, text) in files {
        write_private(&sub.join(name), text)?;
    }
    Ok(sub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_rules_carry_jumps_and_saved_ipvs_match() {
        let payload = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\nCOMMIT\n*filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n\
-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP\nCOMMIT\n";
        let t = with_jumps(payload);
        assert!(t.contains(":PREROUTING ACCEPT [0:0]\n"), "{t}");
        assert!(t.contains(
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"
        ));
        assert!(t.contains(
            "-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vproto 6 --vaddr 1.2.3.4 --vport 80 -j DROP\n"
        ));
        // Repeated prepending leaves INPUT's jumps in reverse declaration order.
        let input: Vec<&str> = t.lines().filter(|l| l.starts_with("-A INPUT ")).collect();
        assert_eq!(input.len(), 3);
        assert!(input[0].ends_with("KUBE-IPVS-FILTER") && input[2].ends_with("KUBE-NODE-PORT"));
        Ruleset::parse(&t, &ParseOptions::default()).expect("the expected rules parse");
    }
}
