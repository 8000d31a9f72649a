//! `ip addr` / `ip -o addr` output (iproute2): the addresses bound to one interface.

use std::net::IpAddr;

/// The addresses of `interface` in `ip addr` or `ip -o addr` output, in order; lines of other
/// interfaces and lines that name no address are ignored.
pub fn interface_addresses(text: &str, interface: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut current_is_interface = false;
    for line in text.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        // `N: IFNAME: <FLAGS> …` header of `ip addr`, or `N: IFNAME inet …` of `ip -o addr`.
        if let (Some(first), Some(name)) = (t.first(), t.get(1))
            && first.ends_with(':')
            && first
                .trim_end_matches(':')
                .bytes()
                .all(|b| b.is_ascii_digit())
        {
            current_is_interface = name.trim_end_matches(':').split('@').next() == Some(interface);
        }
        if !current_is_interface {
            continue;
        }
        if let Some(i) = t.iter().position(|w| *w == "inet" || *w == "inet6")
            && let Some(a) = t
                .get(i + 1)
                .and_then(|a| a.split('/').next())
                .and_then(|a| a.parse().ok())
        {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_one_interface() {
        let t = "5: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN\n    link/ether 1e:…\n    inet 10.96.0.1/32 scope global kube-ipvs0\n       valid_lft forever\n6: eth0: <UP>\n    inet 172.18.0.3/16 scope global eth0\n";
        assert_eq!(
            interface_addresses(t, "kube-ipvs0"),
            vec!["10.96.0.1".parse::<IpAddr>().unwrap()]
        );
        let o = "5: kube-ipvs0    inet 10.96.0.10/32 scope global kube-ipvs0\\       valid_lft forever\n";
        assert_eq!(
            interface_addresses(o, "kube-ipvs0"),
            vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
        );
    }
}
