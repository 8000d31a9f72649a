ip link add kube-ipvs0 type dummy
ip link add eth0 type dummy; ip link set eth0 up
ip addr add 172.18.0.3/24 dev eth0
ip addr add 10.96.0.1/32 dev kube-ipvs0
ip addr add 10.96.0.10/32 dev kube-ipvs0
ip addr add 10.96.50.5/32 dev kube-ipvs0
ip addr add 10.96.60.6/32 dev kube-ipvs0
ip addr add 10.96.120.7/32 dev kube-ipvs0
ip addr add 10.96.200.1/32 dev kube-ipvs0
ip addr add 172.18.255.200/32 dev kube-ipvs0
ip addr add 198.51.100.7/32 dev kube-ipvs0
ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:53
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:9153
ipset add KUBE-CLUSTER-IP 10.96.0.10,udp:53
ipset add KUBE-CLUSTER-IP 10.96.120.7,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.200.1,tcp:443
ipset add KUBE-CLUSTER-IP 10.96.50.5,tcp:8080
ipset add KUBE-CLUSTER-IP 10.96.60.6,tcp:80
ipset create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-EXTERNAL-IP 172.18.0.3,tcp:8080
ipset add KUBE-EXTERNAL-IP 198.51.100.7,tcp:8080
ipset create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
ipset add KUBE-HEALTH-CHECK-NODE-PORT 32000
ipset create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-IPVS-IPS 10.96.0.1
ipset add KUBE-IPVS-IPS 10.96.0.10
ipset add KUBE-IPVS-IPS 10.96.120.7
ipset add KUBE-IPVS-IPS 10.96.200.1
ipset add KUBE-IPVS-IPS 10.96.50.5
ipset add KUBE-IPVS-IPS 10.96.60.6
ipset add KUBE-IPVS-IPS 172.18.255.200
ipset add KUBE-IPVS-IPS 198.51.100.7
ipset create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER 172.18.255.200,tcp:443
ipset create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER-LOCAL 172.18.255.200,tcp:443
ipset create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5
ipset add KUBE-LOOP-BACK 10.244.1.6,tcp:8080,10.244.1.6
ipset add KUBE-LOOP-BACK 10.244.1.9,tcp:8443,10.244.1.9
ipset create KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535
ipset add KUBE-NODE-PORT-LOCAL-TCP 31443
ipset create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535
ipset create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
ipset add KUBE-NODE-PORT-TCP 30080
ipset add KUBE-NODE-PORT-TCP 31443
ipset create KUBE-NODE-PORT-UDP bitmap:port range 0-65535
ipvsadm -A -t 10.96.0.1:443 -s rr
ipvsadm -a -t 10.96.0.1:443 -r 172.18.0.2:6443 -m -w 1
ipvsadm -A -t 10.96.0.10:53 -s rr
ipvsadm -a -t 10.96.0.10:53 -r 10.244.0.2:53 -m -w 1
ipvsadm -a -t 10.96.0.10:53 -r 10.244.0.3:53 -m -w 1
ipvsadm -A -t 10.96.0.10:9153 -s rr
ipvsadm -a -t 10.96.0.10:9153 -r 10.244.0.2:9153 -m -w 1
ipvsadm -a -t 10.96.0.10:9153 -r 10.244.0.3:9153 -m -w 1
ipvsadm -A -t 10.96.50.5:8080 -s rr
ipvsadm -a -t 10.96.50.5:8080 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -t 10.96.60.6:80 -s rr
ipvsadm -A -t 10.96.120.7:80 -s rr -p 10800
ipvsadm -a -t 10.96.120.7:80 -r 10.244.1.5:8080 -m -w 1
ipvsadm -a -t 10.96.120.7:80 -r 10.244.2.8:8080 -m -w 1
ipvsadm -A -t 10.96.200.1:443 -s rr
ipvsadm -a -t 10.96.200.1:443 -r 10.244.1.9:8443 -m -w 1
ipvsadm -a -t 10.96.200.1:443 -r 10.244.2.9:8443 -m -w 1
ipvsadm -A -t 172.18.0.3:8080 -s rr
ipvsadm -a -t 172.18.0.3:8080 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -t 172.18.0.3:30080 -s rr -p 10800
ipvsadm -a -t 172.18.0.3:30080 -r 10.244.1.5:8080 -m -w 1
ipvsadm -a -t 172.18.0.3:30080 -r 10.244.2.8:8080 -m -w 1
ipvsadm -A -t 172.18.0.3:31443 -s rr
ipvsadm -a -t 172.18.0.3:31443 -r 10.244.1.9:8443 -m -w 1
ipvsadm -A -t 172.18.255.200:443 -s rr
ipvsadm -a -t 172.18.255.200:443 -r 10.244.1.9:8443 -m -w 1
ipvsadm -A -t 198.51.100.7:8080 -s rr
ipvsadm -a -t 198.51.100.7:8080 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -u 10.96.0.10:53 -s rr
ipvsadm -a -u 10.96.0.10:53 -r 10.244.0.2:53 -m -w 1
ipvsadm -a -u 10.96.0.10:53 -r 10.244.0.3:53 -m -w 1
iptables-restore --noflush /data/constructed-kind-worker-example.iptables
iptables -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
iptables -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
iptables -t filter -I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
iptables -t filter -I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
iptables -t filter -I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
