ip link add kube-ipvs0 type dummy
ip link add eth0 type dummy; ip link set eth0 up
ip addr add 100.101.102.103/24 dev eth0
ip addr add 10.20.30.41/32 dev kube-ipvs0
ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-CLUSTER-IP 10.20.30.41,sctp:80
ipset create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
ipset create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-IPVS-IPS 10.20.30.41
ipset create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOOP-BACK 10.180.0.1,sctp:80,10.180.0.1
ipset create KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-NODE-PORT-LOCAL-SCTP-HASH 100.101.102.103,sctp:3001
ipset create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535
ipset create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535
ipset create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-NODE-PORT-SCTP-HASH 100.101.102.103,sctp:3001
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
ipset create KUBE-NODE-PORT-UDP bitmap:port range 0-65535
ipvsadm -A --sctp-service 10.20.30.41:80 -s rr
ipvsadm -a --sctp-service 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1
ipvsadm -a --sctp-service 10.20.30.41:80 -r 10.180.1.1:80 -m -w 1
ipvsadm -A --sctp-service 100.101.102.103:3001 -s rr
ipvsadm -a --sctp-service 100.101.102.103:3001 -r 10.180.0.1:80 -m -w 1
iptables-restore --noflush /data/nodeport-ipv4-sctp-etp-local.iptables
iptables -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
iptables -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
iptables -t filter -I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
iptables -t filter -I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
iptables -t filter -I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
