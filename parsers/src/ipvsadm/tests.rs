//! Unit tests of the ipvsadm grammars on small constructed inputs.

use super::*;

const LN: &str = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  172.18.0.2:30080 rr persistent 10800
  -> 10.244.1.5:8080              Masq    1      0          0         
  -> 10.244.2.8:8080              Masq    0      0          0         
TCP  10.96.33.4:8080 sh (sh-fallback,sh-port)
UDP  192.0.2.10:5060 rr persistent 360 mask 255.255.255.0 pe sip ops
  -> 198.51.100.5:5060            Route   1      0          0
TCP  [fd00:10:96::1]:443 rr
  -> [fd00:172:18::2]:6443        Masq    1      0          0         
FWM  200 IPv6 wlc
";

#[test]
fn default_listing() {
    let d = parse_dump(LN).unwrap();
    assert_eq!(d.listings.len(), 1);
    let l = &d.listings[0];
    assert_eq!(
        (l.layout, l.version, l.conn_table_size),
        (Layout::Default, Some("1.2.1"), Some(4096))
    );
    assert_eq!(l.services.len(), 5);
    let s0 = &l.services[0];
    assert_eq!(s0.persistent, Some(10800));
    assert_eq!(s0.real_servers[1].weight, Some(0));
    assert_eq!(l.services[1].sched_flags, vec!["sh-fallback", "sh-port"]);
    let s2 = &l.services[2];
    assert_eq!(
        (s2.netmask, s2.pe, s2.ops),
        (Some("255.255.255.0"), Some("sip"), true)
    );
    assert_eq!(s2.real_servers[0].forward, Some(Forward::Route));
    assert_eq!(
        l.services[4].key,
        ServiceKey::Fwmark {
            mark: 200,
            ipv6: true
        }
    );
}

#[test]
fn save_form_matches_listing() {
    let sn = "-A -t 172.18.0.2:30080 -s rr -p 10800
-a -t 172.18.0.2:30080 -r 10.244.1.5:8080 -m -w 1
-a -t 172.18.0.2:30080 -r 10.244.2.8:8080 -m -w 0
-A -t 10.96.33.4:8080 -s sh -b sh-fallback,sh-port
-A -u 192.0.2.10:5060 -s rr -p 360 -M 255.255.255.0 --pe sip -o
-a -u 192.0.2.10:5060 -r 198.51.100.5:5060 -g -w 1
-A -t [fd00:10:96::1]:443 -s rr
-a -t [fd00:10:96::1]:443 -r [fd00:172:18::2]:6443 -m -w 1
-A -f 200 -6 -s wlc
";
    let a = parse_dump(LN).unwrap().merged_services();
    let b = parse_dump(sn).unwrap().merged_services();
    fn strip<'a>(v: Vec<VirtualService<'a>>) -> Vec<impl PartialEq + std::fmt::Debug + use<'a>> {
        v.into_iter()
            .map(|s| {
                let rs: Vec<_> = s
                    .real_servers
                    .iter()
                    .map(|r| (r.addr, r.port, r.forward, r.weight))
                    .collect();
                (
                    s.key,
                    s.scheduler,
                    s.sched_flags,
                    s.persistent,
                    s.netmask,
                    s.pe,
                    s.ops,
                    rs,
                )
            })
            .collect()
    }
    assert_eq!(strip(a), strip(b));
}

#[test]
fn stats_and_conns_merge() {
    let text = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes
  -> RemoteAddress:Port
TCP  10.96.80.80:80               99999999  123456K     987G    1234M     123T
  -> 10.244.3.10:8080             99999999  123456K     987G    1234M     123T
IPVS connection entries
pro expire state       source             virtual            destination
TCP 179:58 NONE        10.244.3.4:0       10.96.120.7:80     10.244.1.5:8080
SCTP 00:03  ESTABLISHED 10.244.1.9:40000   10.96.77.1:9999    10.244.1.7:9999
Timeout (tcp tcpfin udp): 900 120 300
";
    let d = parse_dump(text).unwrap();
    assert_eq!(d.listings[0].layout, Layout::Stats);
    let st = d.listings[0].services[0].stats.unwrap();
    assert_eq!((st.in_pkts.value, st.in_pkts.exact), (123_456_000, false));
    assert_eq!(d.connections.len(), 2);
    assert!(d.connections[0].is_template());
    assert_eq!(d.connections[1].protocol, "SCTP");
    assert_eq!(
        d.timeouts,
        Some(Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 300
        })
    );
    assert!(!d.has_attributes());
}

#[test]
fn prompts_are_skipped_garbage_is_an_error() {
    let d =
        parse_dump("[root@centos ~]# ipvsadm -Ln\nIP Virtual Server version 1.2.1 (size=4096)\n")
            .unwrap();
    assert_eq!(d.skipped.len(), 1);
    let e = parse_dump("Prot LocalAddress:Port Scheduler Flags\nTCP  10.96.0.1:https rr\n")
        .unwrap_err();
    assert_eq!((e.line, e.col), (2, 6));
    let e = parse_dump("Prot LocalAddress:Port Scheduler Flags\nTCP  10.96.0.1:443 rr\n  -> 10.0.0.1:80 Masq x 0 0\n")
        .unwrap_err();
    assert_eq!((e.line, e.col), (3, 23));
    assert!(parse_dump("hello world\n").is_err());
    assert!(parse_dump("-a -t 10.0.0.1:80 -r 10.0.0.2:80 -m\n").is_err());
}

#[test]
fn other_layouts() {
    let t = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port            Weight    PersistConn ActiveConn InActConn
  -> RemoteAddress:Port
TCP  10.11.12.13:6379 wlc persistent 60
  -> 10.192.0.1:32768             1         1           1          0
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn InActConn
UDP  192.0.2.10:5060 rr
  -> 198.51.100.6:5060            Tunnel  ipip          1      0          0
";
    let d = parse_dump(t).unwrap();
    assert_eq!(d.listings[0].layout, Layout::PersistentConn);
    assert_eq!(
        d.listings[0].services[0].real_servers[0].persist_conns,
        Some(1)
    );
    assert_eq!(d.listings[1].layout, Layout::TunInfo);
    assert_eq!(
        d.listings[1].services[0].real_servers[0].tunnel,
        Some("ipip")
    );
}
