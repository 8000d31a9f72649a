//! `--model kernel` on an iptables ruleset: the first packet of a new connection walked through
//! the tables netfilter runs at each hook, in priority order, as [`super::super::walk`] takes
//! it through the hooks.
//!
//! Arriving traffic: raw/mangle PREROUTING → nat PREROUTING → routing on the (possibly DNAT'd)
//! destination → local: mangle/filter/security/nat INPUT; forwarded: mangle/filter/security
//! FORWARD → mangle/nat POSTROUTING. Node-originated traffic: raw/mangle/nat/filter/security
//! OUTPUT → mangle/nat POSTROUTING, and for a local destination the loopback re-entry
//! (raw/mangle PREROUTING, mangle/filter/security INPUT; nat is not consulted again). Tables run
//! only where the dump has the chain, so raw/mangle cost nothing when absent.
//!
//! Each `statistic` rule splits the walk into a matched and a skipped branch with their
//! probabilities (the kernel's stored `round(p·2^31)/2^31`), so the result is every outcome
//! with its probability, DNAT destination, verdict, masquerade/SNAT and rule-by-rule path.
//! Marks persist along the walk (KUBE-MARK-MASQ sets, KUBE-POSTROUTING clears), conntrack state
//! is `NEW` (plus virtual `DNAT`/`SNAT` after NAT), `recent` lists start empty.

use super::super::SimError;
use super::super::engine::{MatchCtx, MatchPolicy, PacketView, RuleMatch, describe_match, matches};
use super::super::outcome::{Distribution, Step, StepResult, StepRule, Verdict};
use super::super::walk::{At, BranchOf, ChainEnd, Flow, KernelInput, Model, Phase, Walk};
use crate::model::Ruleset;
use kproxy_parsers::iptables::{GenericOpt, MarkOp, Match, Module, RecentAction, Rule, Target};

/// The built-in chain of a stage (`PREROUTING`).
fn builtin_chain(phase: Phase) -> &'static str {
    match phase {
        Phase::Prerouting | Phase::LoopbackPrerouting => "PREROUTING",
        Phase::Input | Phase::LoopbackInput => "INPUT",
        Phase::Forward => "FORWARD",
        Phase::Output => "OUTPUT",
        Phase::Postrouting => "POSTROUTING",
        Phase::Done => "",
    }
}

/// The tables a stage runs, in priority order.
fn tables(phase: Phase) -> &'static [&'static str] {
    match phase {
        Phase::Prerouting => &["raw", "mangle", "nat"],
        Phase::Input => &["mangle", "filter", "security", "nat"],
        Phase::Forward => &["mangle", "filter", "security"],
        Phase::Output => &["raw", "mangle", "nat", "filter", "security"],
        Phase::Postrouting => &["mangle", "nat"],
        Phase::LoopbackPrerouting => &["raw", "mangle"],
        Phase::LoopbackInput => &["mangle", "filter", "security"],
        Phase::Done => &[],
    }
}

/// An iptables ruleset as the walk reads it.
struct Iptables<'d, 'a> {
    rules: &'d Ruleset<'a>,
}

/// A branch of the iptables walk.
type Branch<'d, 'a> = BranchOf<'d, 'a, Iptables<'d, 'a>>;

/// Walks `input.packet` through `rules` and returns every outcome.
pub fn simulate<'d, 'a>(
    rules: &'d Ruleset<'a>,
    input: &KernelInput,
) -> Result<Distribution<'d, 'a>, SimError> {
    let mut walk = Walk::new(input);
    if rules.table("nat").is_none() {
        walk.note("the dump has no nat table: no service rules apply".to_string());
    }
    walk.run(&Iptables { rules }, Vec::new())
}

impl<'d, 'a> Model<'d, 'a> for Iptables<'d, 'a> {
    /// (table, chain).
    type Chain = (&'static str, &'a str);
    type Rule = &'d Rule<'a>;
    /// The `recent` lists the packet's source was added to on this walk.
    type State = Vec<&'a str>;

    fn next_base(&self, b: &mut Branch<'d, 'a>) -> Option<Self::Chain> {
        let hook = builtin_chain(b.phase);
        while let Some(&table) = tables(b.phase).get(b.base) {
            b.base += 1;
            if self.rules.chain(table, hook).is_some() {
                return Some((table, hook));
            }
        }
        None
    }

    fn rule_at(&self, (table, name): Self::Chain, index: usize) -> At<Self::Rule> {
        let rules: &'d Ruleset<'a> = self.rules;
        match rules.chain(table, name) {
            Some(chain) => chain
                .rules
                .get(index)
                .map_or(At::End, |e| At::Rule(&e.rule)),
            None => At::Missing,
        }
    }

    fn chain_end(&self, (table, name): Self::Chain) -> ChainEnd<'a> {
        let chain = self.rules.chain(table, name);
        let policy = chain.and_then(|c| c.policy).unwrap_or("ACCEPT");
        ChainEnd {
            table,
            chain: name,
            policy,
            drop: policy.eq_ignore_ascii_case("DROP"),
            shown: chain.is_some_and(|c| !c.rules.is_empty()) || policy != "ACCEPT",
            filter: table == "filter",
        }
    }

    // Inlined into the walk's loop, which calls it once per rule.
    #[inline]
    fn eval(
        &self,
        walk: &mut Walk<'_, 'd, 'a, Self>,
        b: &mut Branch<'d, 'a>,
        (table, chain_name): Self::Chain,
        rule: &'d Rule<'a>,
        number: usize,
    ) -> Result<Flow<'d, 'a>, SimError> {
        let input = walk.input;
        let ctx = MatchCtx {
            policy: MatchPolicy::Kernel,
            local: &input.local,
        };
        let result = matches(rule, &view(walk, b), &ctx);
        let step = |result| Step {
            table,
            chain: chain_name,
            number,
            result,
            rule: Some(StepRule::Iptables(rule)),
            policy: None,
        };
        match result {
            RuleMatch::Fails { at, undecidable } => {
                if let Some(why) = undecidable {
                    let what = rule
                        .matches()
                        .nth(at)
                        .map(|m| describe_match(rule, &m))
                        .unwrap_or_default();
                    walk.note(format!(
                        "`{what}` ({table}/{chain_name}#{number}): {why}; taken as not matching"
                    ));
                }
                b.path.push(step(StepResult::Skipped { at, undecidable }));
                return Ok(Flow::Next);
            }
            RuleMatch::Random(p) => {
                walk.defer(b.fork(1.0 - p, step(StepResult::SkippedRandom(1.0 - p))));
                b.probability *= p;
                b.path.push(step(StepResult::MatchedRandom(p)));
            }
            RuleMatch::Matches => b.path.push(step(StepResult::Matched)),
        }
        record_recent(rule, &mut b.state);
        let here = format!("{table}/{chain_name}#{number}");
        let Some(target) = &rule.target() else {
            return Ok(Flow::Next);
        };
        match target {
            Target::Jump(next) | Target::Goto(next) => {
                if self.rules.chain(table, next).is_none() {
                    walk.note(format!(
                        "{here} jumps to {next}, which does not exist in {table}; ignored"
                    ));
                    return Ok(Flow::Next);
                }
                b.enter(
                    (table, next),
                    table,
                    next,
                    matches!(target, Target::Goto(_)),
                )?;
            }
            Target::Accept => b.accept(here, table == "filter"),
            Target::Drop => return Ok(Flow::Done(b.finish(Verdict::Drop, Some(here)))),
            Target::Reject { .. } => return Ok(Flow::Done(b.finish(Verdict::Reject, Some(here)))),
            Target::Return => b.leave(),
            Target::Dnat { to: range, .. } => {
                if range.addr_last.is_some() || range.ports.is_some_and(|p| p.first != p.last) {
                    walk.note(format!(
                        "{here}: DNAT to a range; the first address/port is used"
                    ));
                }
                b.dnat_to(range.addr.unwrap_or(b.dst), range.ports.map(|p| p.first));
                b.stack.clear();
            }
            Target::Snat { to, .. } => {
                if let Some(addr) = to.addr {
                    b.src = addr;
                    b.snat = Some(addr);
                    b.ct.snat = true;
                }
                b.stack.clear();
            }
            Target::Masquerade { .. } => {
                walk.masquerade(b, &here, "MASQUERADE");
                b.stack.clear();
            }
            Target::Mark(op) => b.mark = apply_mark(*op, b.mark),
            Target::Notrack => b.ct.untracked = true,
            Target::Ct(opts) if rule.options(*opts).any(|o| o.name == "notrack") => {
                b.ct.untracked = true
            }
            Target::Ct(_) | Target::Connmark(_) | Target::Log(_) | Target::Trace => {}
            Target::Generic { name, options } if *name == "REDIRECT" => {
                let dst = walk.redirect_address(b.dst);
                b.dnat_to(dst, to_ports(rule.options(*options)));
                b.stack.clear();
            }
            Target::Generic { name, .. } => {
                walk.note(format!(
                    "{here}: target {name} is not modelled; treated as not terminating"
                ));
            }
            Target::Unreadable { raw, reason } => {
                walk.note(format!(
                    "{here}: target `{raw}` is unreadable ({reason}); treated as not terminating"
                ));
            }
        }
        Ok(Flow::Next)
    }
}

/// The packet as rules see it now.
fn view<'s, 'd, 'a>(
    walk: &'s Walk<'_, 'd, 'a, Iptables<'d, 'a>>,
    b: &'s Branch<'d, 'a>,
) -> PacketView<'s> {
    let (in_iface, out_iface) = walk.interfaces(b);
    PacketView {
        src: b.src,
        sport: walk.input.packet.sport,
        dst: b.dst,
        dport: b.dport,
        proto: walk.input.packet.proto,
        in_iface,
        out_iface,
        mark: b.mark,
        ct: b.ct,
        recent: &b.state,
    }
}

/// `recent --set` adds the source to the list for the rest of the walk; `--remove` takes it off.
fn record_recent<'a>(rule: &Rule<'a>, recent: &mut Vec<&'a str>) {
    for m in rule.matches() {
        if let Match::Module(Module::Recent(r)) = m {
            match r.action {
                RecentAction::Set if !r.negated => recent.push(r.name),
                RecentAction::Remove => recent.retain(|n| *n != r.name),
                _ => {}
            }
        }
    }
}

/// `-j MARK` semantics.
pub fn apply_mark(op: MarkOp, mark: u32) -> u32 {
    match op {
        MarkOp::SetXmark { value, mask } => (mark & !mask) ^ value,
        MarkOp::SetMark { value, mask } => (mark & !mask) | value,
        MarkOp::Or(v) => mark | v,
        MarkOp::Xor(v) => mark ^ v,
        MarkOp::And(v) => mark & v,
    }
}

fn to_ports<'a>(mut options: impl Iterator<Item = GenericOpt<'a>>) -> Option<u16> {
    let opt = options.find(|o| o.name == "to-ports")?;
    opt.values
        .iter()
        .next()?
        .split(['-', ':'])
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::iptables::ParseOptions;
    use crate::trace::sim::{LocalAddrs, Origin};
    use std::net::IpAddr;

    /// (probability, DNAT, verdict, masquerade, SNAT source, notes) per outcome.
    type Row = (
        f64,
        Option<String>,
        Verdict,
        bool,
        Option<IpAddr>,
        Vec<String>,
    );

    fn run(rules: &str, packet: &str, origin: Origin, in_iface: Option<&str>) -> Vec<Row> {
        let rs = Ruleset::parse(rules, &ParseOptions::strict()).unwrap();
        let input = KernelInput {
            packet: packet.parse().unwrap(),
            origin,
            local: LocalAddrs::kernel(vec![
                "192.168.1.2".parse().unwrap(),
                "10.1.0.1".parse().unwrap(),
            ]),
            in_iface: in_iface.map(str::to_string),
            out_iface: None,
        };
        let d = simulate(&rs, &input).unwrap();
        d.outcomes
            .iter()
            .map(|o| {
                (
                    o.probability,
                    o.dnat.map(|(ip, p)| format!("{ip}:{p}")),
                    o.verdict,
                    o.masquerade,
                    o.snat,
                    d.notes.clone(),
                )
            })
            .collect()
    }

    const SERVICE: &str = "*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A ! -s 10.244.0.0/16 -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -m statistic --mode random --probability 0.33333333349 -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination 10.244.1.6:8080
-A KUBE-SVC-A -j DNAT --to-destination 10.244.2.7:8080
COMMIT
";

    /// `n` chains jumped to in sequence from KUBE-SERVICES, each holding a rule that cannot be
    /// decided (an ipset of its own, so each makes a note of its own) and returns.
    fn chain_sequence(n: usize) -> String {
        let mut text = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n");
        for i in 0..n {
            text.push_str(&format!(":C{i} - [0:0]\n"));
        }
        text.push_str("-A PREROUTING -j KUBE-SERVICES\n");
        for i in 0..n {
            text.push_str(&format!("-A KUBE-SERVICES -j C{i}\n"));
        }
        for i in 0..n {
            text.push_str(&format!("-A C{i} -m set --match-set S{i} dst -j RETURN\n"));
        }
        text.push_str("COMMIT\n");
        text
    }

    /// The fastest of three walks of `rules` (the machine may be busy with other work).
    fn walk_time(rules: &Ruleset<'_>) -> (std::time::Duration, usize, usize) {
        let input = KernelInput {
            packet: "10.1.1.1->10.96.0.1:80/tcp".parse().unwrap(),
            origin: Origin::Pod,
            local: LocalAddrs::kernel(Vec::new()),
            in_iface: None,
            out_iface: None,
        };
        let mut best = std::time::Duration::MAX;
        let mut shape = (0, 0);
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            let d = simulate(rules, &input).unwrap();
            best = best.min(t0.elapsed());
            shape = (d.outcomes[0].path.len(), d.notes.len());
        }
        (best, shape.0, shape.1)
    }

    #[test]
    fn walk_time_grows_linearly_with_the_chains_jumped_to() {
        // A loop guard or note list searched from the start at each step makes the walk
        // quadratic: sixteen times the chains would take 256 times as long. The wide margin
        // keeps a loaded machine's noise from failing a linear walk.
        let (small, large) = (2_000, 32_000);
        let (small_text, large_text) = (chain_sequence(small), chain_sequence(large));
        let opts = ParseOptions::strict();
        let small_rules = Ruleset::parse(&small_text, &opts).unwrap();
        let large_rules = Ruleset::parse(&large_text, &opts).unwrap();
        let (t_small, steps, notes) = walk_time(&small_rules);
        // PREROUTING's jump and policy, and per chain the jump to it and its rule; one note per
        // chain plus the one about missing node addresses.
        assert_eq!((steps, notes), (2 + 2 * small, small + 1));
        let (t_large, steps, notes) = walk_time(&large_rules);
        assert_eq!((steps, notes), (2 + 2 * large, large + 1));
        let ratio = t_large.as_secs_f64() / t_small.as_secs_f64().max(1e-6);
        assert!(
            ratio < 64.0,
            "16x the chains took {ratio:.1}x as long ({t_small:?} for {small}, {t_large:?} for {large})"
        );
    }

    #[test]
    fn statistic_splits_into_a_distribution_and_marks_drive_masquerade() {
        let out = run(
            SERVICE,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        let dnats: Vec<_> = out.iter().map(|o| o.1.clone().unwrap()).collect();
        assert_eq!(
            dnats,
            ["10.244.1.5:8080", "10.244.1.6:8080", "10.244.2.7:8080"]
        );
        for o in &out {
            assert!((o.0 - 1.0 / 3.0).abs() < 1e-6, "{}", o.0);
            assert_eq!((o.2, o.3), (Verdict::Accept, true));
            // The local address on the destination's subnet side is the longest-prefix match.
            assert_eq!(o.4, Some("10.1.0.1".parse().unwrap()));
        }
        let pod = run(SERVICE, "10.244.3.3->172.30.0.10:80/tcp", Origin::Pod, None);
        assert!(pod.iter().all(|o| !o.3 && o.4.is_none()));
        let miss = run(SERVICE, "10.244.3.3->172.30.0.10:81/tcp", Origin::Pod, None);
        assert_eq!(miss.len(), 1);
        assert_eq!(miss[0].1, None);
    }

    #[test]
    fn policies_goto_return_and_drop() {
        let rules = "*nat
:PREROUTING ACCEPT [0:0]
:A - [0:0]
:B - [0:0]
-A PREROUTING -j A
-A PREROUTING -p tcp -j DNAT --to-destination 10.0.0.9:81
-A A -g B
-A A -j DNAT --to-destination 10.0.0.1:80
-A B -j RETURN
-A B -j DNAT --to-destination 10.0.0.2:80
COMMIT
*filter
:FORWARD DROP [0:0]
:X - [0:0]
-A FORWARD -d 10.0.0.9/32 -j X
-A X -p tcp -m tcp --dport 81 -j ACCEPT
COMMIT
";
        let out = run(
            rules,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.as_deref(), Some("10.0.0.9:81"));
        assert_eq!(out[0].2, Verdict::Accept);
        let dropped = rules.replace("--dport 81 -j ACCEPT", "--dport 82 -j ACCEPT");
        let out = run(
            &dropped,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out[0].2, Verdict::Drop);
    }

    #[test]
    fn conntrack_recent_and_interfaces() {
        let rules = "*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m recent --rcheck --name S -j DROP
-A INPUT -m recent --set --name S
-A INPUT -i eth9 -j DROP
-A INPUT -m recent --rcheck --name S -m conntrack --ctstate NEW -d 192.168.1.2/32 -p tcp -m tcp --dport 22 -j REJECT
-A INPUT -j ACCEPT
-A OUTPUT -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
";
        let out = run(
            rules,
            "192.168.1.9->192.168.1.2:22/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out[0].2, Verdict::Reject);
        assert!(
            out[0]
                .5
                .iter()
                .any(|n| n.contains("-i eth9") && n.contains("--in-interface")),
            "{:?}",
            out[0].5
        );
        let out = run(
            rules,
            "192.168.1.9->192.168.1.2:22/tcp",
            Origin::External,
            Some("eth9"),
        );
        assert_eq!(out[0].2, Verdict::Drop);
        let out = run(rules, "192.168.1.2->127.0.0.1:22/tcp", Origin::Node, None);
        assert_eq!(out[0].2, Verdict::Drop);
    }

    #[test]
    fn node_traffic_to_a_local_address_loops_back_through_input() {
        let rules = "*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -p tcp -m tcp --dport 10250 -j REJECT
COMMIT
";
        let out = run(
            rules,
            "192.168.1.2->192.168.1.2:10250/tcp",
            Origin::Node,
            None,
        );
        assert_eq!(out[0].2, Verdict::Reject);
    }
}
