//! iptables text: `iptables-save`, restore input, `iptables -S`.
