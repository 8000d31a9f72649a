ip link add kube-ipvs0 type dummy
ip link add eth0 type dummy; ip link set eth0 up
ip addr add 2001:db8::1:1/64 dev eth0
ip addr add 2001:db8::1:2/64 dev eth0
ip addr add 2020::1/128 dev kube-ipvs0
ipset create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset add KUBE-6-CLUSTER-IP 2020::1,sctp:80
ipset create KUBE-6-EXTERNAL-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-EXTERNAL-IP-LOCAL hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
ipset create KUBE-6-IPVS-IPS hash:ip family inet6 hashsize 1024 maxelem 65536
ipset add KUBE-6-IPVS-IPS 2020::1
ipset create KUBE-6-LOAD-BALANCER hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-LOAD-BALANCER-FW hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-LOAD-BALANCER-LOCAL hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-LOOP-BACK hash:ip,port,ip family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-NODE-PORT-LOCAL-SCTP-HAS hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset create KUBE-6-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535
ipset create KUBE-6-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535
ipset create KUBE-6-NODE-PORT-SCTP-HASH hash:ip,port family inet6 hashsize 1024 maxelem 65536
ipset add KUBE-6-NODE-PORT-SCTP-HASH 2001:db8::1:1,sctp:3001
ipset add KUBE-6-NODE-PORT-SCTP-HASH 2001:db8::1:2,sctp:3001
ipset create KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535
ipset create KUBE-6-NODE-PORT-UDP bitmap:port range 0-65535
ipvsadm -A --sctp-service [2001:db8::1:1]:3001 -s rr
ipvsadm -a --sctp-service [2001:db8::1:1]:3001 -r [2001::1]:80 -m -w 1
ipvsadm -A --sctp-service [2001:db8::1:2]:3001 -s rr
ipvsadm -a --sctp-service [2001:db8::1:2]:3001 -r [2001::1]:80 -m -w 1
ipvsadm -A --sctp-service [2020::1]:80 -s rr
ipvsadm -a --sctp-service [2020::1]:80 -r [2001::1]:80 -m -w 1
ip6tables-restore --noflush /data/nodeport-ipv6-sctp-multiple-node-ips.iptables
ip6tables -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ip6tables -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
ip6tables -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
ip6tables -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
ip6tables -t filter -I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
ip6tables -t filter -I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
ip6tables -t filter -I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
ip6tables -t filter -I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
ip6tables -t filter -I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
