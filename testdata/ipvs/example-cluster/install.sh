ip link add kube-ipvs0 type dummy
ip link add eth0 type dummy; ip link set eth0 up
ip addr add 192.168.77.2/24 dev eth0
ip addr add 10.96.0.1/32 dev kube-ipvs0
ip addr add 10.96.0.10/32 dev kube-ipvs0
ip addr add 10.96.100.10/32 dev kube-ipvs0
ip addr add 10.96.100.11/32 dev kube-ipvs0
ip addr add 10.96.100.20/32 dev kube-ipvs0
ip addr add 10.96.100.21/32 dev kube-ipvs0
ip addr add 10.96.100.30/32 dev kube-ipvs0
ip addr add 10.96.100.40/32 dev kube-ipvs0
ip addr add 10.96.100.50/32 dev kube-ipvs0
ip addr add 10.96.100.60/32 dev kube-ipvs0
ip addr add 10.96.200.10/32 dev kube-ipvs0
ip addr add 192.168.77.50/32 dev kube-ipvs0
ip addr add 192.168.77.100/32 dev kube-ipvs0
ip addr add 192.168.77.101/32 dev kube-ipvs0
ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:53
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:9153
ipset add KUBE-CLUSTER-IP 10.96.0.10,udp:53
ipset add KUBE-CLUSTER-IP 10.96.100.10,tcp:443
ipset add KUBE-CLUSTER-IP 10.96.100.10,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.100.11,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.100.20,tcp:443
ipset add KUBE-CLUSTER-IP 10.96.100.21,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.100.30,tcp:8080
ipset add KUBE-CLUSTER-IP 10.96.100.40,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.100.50,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.100.60,tcp:80
ipset add KUBE-CLUSTER-IP 10.96.200.10,tcp:9100
ipset create KUBE-EXTERNAL-IP hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-EXTERNAL-IP 192.168.77.50,tcp:8080
ipset create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-HEALTH-CHECK-NODE-PORT bitmap:port range 0-65535
ipset add KUBE-HEALTH-CHECK-NODE-PORT 32000
ipset add KUBE-HEALTH-CHECK-NODE-PORT 32001
ipset create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-IPVS-IPS 10.96.0.1
ipset add KUBE-IPVS-IPS 10.96.0.10
ipset add KUBE-IPVS-IPS 10.96.100.10
ipset add KUBE-IPVS-IPS 10.96.100.11
ipset add KUBE-IPVS-IPS 10.96.100.20
ipset add KUBE-IPVS-IPS 10.96.100.21
ipset add KUBE-IPVS-IPS 10.96.100.30
ipset add KUBE-IPVS-IPS 10.96.100.40
ipset add KUBE-IPVS-IPS 10.96.100.50
ipset add KUBE-IPVS-IPS 10.96.100.60
ipset add KUBE-IPVS-IPS 10.96.200.10
ipset add KUBE-IPVS-IPS 192.168.77.100
ipset add KUBE-IPVS-IPS 192.168.77.101
ipset add KUBE-IPVS-IPS 192.168.77.50
ipset create KUBE-LOAD-BALANCER hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER 192.168.77.100,tcp:443
ipset add KUBE-LOAD-BALANCER 192.168.77.101,tcp:80
ipset create KUBE-LOAD-BALANCER-FW hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER-FW 192.168.77.100,tcp:443
ipset create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER-LOCAL 192.168.77.100,tcp:443
ipset add KUBE-LOAD-BALANCER-LOCAL 192.168.77.101,tcp:80
ipset create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.168.77.100,tcp:443,192.168.77.0/28
ipset add KUBE-LOAD-BALANCER-SOURCE-CIDR 192.168.77.100,tcp:443,203.0.113.0/24
ipset create KUBE-LOAD-BALANCER-SOURCE-IP hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOAD-BALANCER-SOURCE-IP 192.168.77.100,tcp:443,192.168.77.100
ipset create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536
ipset add KUBE-LOOP-BACK 10.244.1.10,tcp:8080,10.244.1.10
ipset add KUBE-LOOP-BACK 10.244.1.10,tcp:8443,10.244.1.10
ipset add KUBE-LOOP-BACK 10.244.1.11,tcp:8080,10.244.1.11
ipset add KUBE-LOOP-BACK 10.244.1.11,tcp:8443,10.244.1.11
ipset add KUBE-LOOP-BACK 10.244.1.20,tcp:8443,10.244.1.20
ipset add KUBE-LOOP-BACK 10.244.1.3,tcp:53,10.244.1.3
ipset add KUBE-LOOP-BACK 10.244.1.3,tcp:9153,10.244.1.3
ipset add KUBE-LOOP-BACK 10.244.1.3,udp:53,10.244.1.3
ipset add KUBE-LOOP-BACK 10.244.1.40,tcp:8080,10.244.1.40
ipset add KUBE-LOOP-BACK 10.244.1.50,tcp:8080,10.244.1.50
ipset add KUBE-LOOP-BACK 10.244.1.60,tcp:9200,10.244.1.60
ipset add KUBE-LOOP-BACK 192.168.77.2,tcp:9100,192.168.77.2
ipset create KUBE-NODE-PORT-LOCAL-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535
ipset add KUBE-NODE-PORT-LOCAL-TCP 30081
ipset add KUBE-NODE-PORT-LOCAL-TCP 30443
ipset create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535
ipset create KUBE-NODE-PORT-SCTP-HASH hash:ip,port family inet hashsize 1024 maxelem 65536
ipset create KUBE-NODE-PORT-TCP bitmap:port range 0-65535
ipset add KUBE-NODE-PORT-TCP 30080
ipset add KUBE-NODE-PORT-TCP 30081
ipset add KUBE-NODE-PORT-TCP 30443
ipset create KUBE-NODE-PORT-UDP bitmap:port range 0-65535
ipvsadm -A -t 10.96.0.1:443 -s rr
ipvsadm -a -t 10.96.0.1:443 -r 192.168.77.2:6443 -m -w 1
ipvsadm -A -t 10.96.0.10:53 -s rr
ipvsadm -a -t 10.96.0.10:53 -r 10.244.1.3:53 -m -w 1
ipvsadm -a -t 10.96.0.10:53 -r 10.244.2.3:53 -m -w 1
ipvsadm -A -t 10.96.0.10:9153 -s rr
ipvsadm -a -t 10.96.0.10:9153 -r 10.244.1.3:9153 -m -w 1
ipvsadm -a -t 10.96.0.10:9153 -r 10.244.2.3:9153 -m -w 1
ipvsadm -A -t 10.96.100.10:80 -s rr
ipvsadm -a -t 10.96.100.10:80 -r 10.244.1.10:8080 -m -w 1
ipvsadm -a -t 10.96.100.10:80 -r 10.244.1.11:8080 -m -w 1
ipvsadm -a -t 10.96.100.10:80 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -t 10.96.100.10:443 -s rr
ipvsadm -a -t 10.96.100.10:443 -r 10.244.1.10:8443 -m -w 1
ipvsadm -a -t 10.96.100.10:443 -r 10.244.1.11:8443 -m -w 1
ipvsadm -a -t 10.96.100.10:443 -r 10.244.2.10:8443 -m -w 1
ipvsadm -A -t 10.96.100.11:80 -s rr
ipvsadm -a -t 10.96.100.11:80 -r 10.244.1.10:8080 -m -w 1
ipvsadm -a -t 10.96.100.11:80 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -t 10.96.100.20:443 -s rr
ipvsadm -a -t 10.96.100.20:443 -r 10.244.1.20:8443 -m -w 1
ipvsadm -a -t 10.96.100.20:443 -r 10.244.2.20:8443 -m -w 1
ipvsadm -A -t 10.96.100.21:80 -s rr
ipvsadm -a -t 10.96.100.21:80 -r 10.244.2.30:8080 -m -w 1
ipvsadm -A -t 10.96.100.30:8080 -s rr
ipvsadm -a -t 10.96.100.30:8080 -r 10.244.1.40:8080 -m -w 1
ipvsadm -A -t 10.96.100.40:80 -s rr -p 600
ipvsadm -a -t 10.96.100.40:80 -r 10.244.1.50:8080 -m -w 1
ipvsadm -a -t 10.96.100.40:80 -r 10.244.2.50:8080 -m -w 1
ipvsadm -A -t 10.96.100.50:80 -s rr
ipvsadm -A -t 10.96.100.60:80 -s rr
ipvsadm -a -t 10.96.100.60:80 -r 10.244.1.60:9200 -m -w 1
ipvsadm -a -t 10.96.100.60:80 -r 10.244.2.60:9200 -m -w 1
ipvsadm -A -t 10.96.200.10:9100 -s rr
ipvsadm -a -t 10.96.200.10:9100 -r 192.168.77.2:9100 -m -w 1
ipvsadm -A -t 192.168.77.2:30080 -s rr
ipvsadm -a -t 192.168.77.2:30080 -r 10.244.1.10:8080 -m -w 1
ipvsadm -a -t 192.168.77.2:30080 -r 10.244.2.10:8080 -m -w 1
ipvsadm -A -t 192.168.77.2:30081 -s rr
ipvsadm -a -t 192.168.77.2:30081 -r 10.244.2.30:8080 -m -w 1
ipvsadm -A -t 192.168.77.2:30443 -s rr
ipvsadm -a -t 192.168.77.2:30443 -r 10.244.1.20:8443 -m -w 1
ipvsadm -A -t 192.168.77.50:8080 -s rr
ipvsadm -a -t 192.168.77.50:8080 -r 10.244.1.40:8080 -m -w 1
ipvsadm -A -t 192.168.77.100:443 -s rr
ipvsadm -a -t 192.168.77.100:443 -r 10.244.1.20:8443 -m -w 1
ipvsadm -A -t 192.168.77.101:80 -s rr
ipvsadm -a -t 192.168.77.101:80 -r 10.244.2.30:8080 -m -w 1
ipvsadm -A -u 10.96.0.10:53 -s rr
ipvsadm -a -u 10.96.0.10:53 -r 10.244.1.3:53 -m -w 1
ipvsadm -a -u 10.96.0.10:53 -r 10.244.2.3:53 -m -w 1
iptables-restore --noflush /data/example-cluster.iptables
iptables -t nat -I OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
iptables -t nat -I POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
iptables -t filter -I FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
iptables -t filter -I INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
iptables -t filter -I INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
iptables -t filter -I INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
iptables -t filter -I OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
