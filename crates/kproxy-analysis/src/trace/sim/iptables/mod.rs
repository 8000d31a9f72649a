//! The packet simulator on iptables rulesets (`trace --packet --iptables-save FILE`), on the
//! rules of [`crate::model::Ruleset`] matched by the shared [`super::engine`].
//!
//! * [`kernel`] — `--model kernel`: the tables netfilter runs at each hook, rule by rule;
//!   `statistic` rules split the walk, giving a [`Distribution`](super::Distribution) of outcomes.
//! * [`kptest`] — `--model kube-proxy-test`: kube-proxy's unit-test tracer, formatted as its
//!   tests compare it (`{"output": "10.180.0.1:80, 10.180.2.1:80", "masq": true}`).
//! * [`partial`] — where a walk starts when the paste lacks the built-in chains.

pub mod kernel;
pub mod kptest;
pub mod partial;
