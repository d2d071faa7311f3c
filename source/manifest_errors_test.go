package source

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseManifestsErrors(t *testing.T) {
	const svcHead = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: demo\n"
	const sliceHead = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: demo\n  labels: {kubernetes.io/service-name: web}\n"
	const good = svcHead + "spec:\n  ports: [{port: 80}]\n"
	tests := []struct {
		name string
		data string
		want []string // each must appear in one error, one error each
	}{
		{
			name: "port out of range in the third document",
			data: "# header\n---\n" + sliceHead + "addressType: IPv4\n---\n" +
				strings.Replace(good, "name: web", "name: api", 1) + "---\n" +
				"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  ports:\n  - port: 70000\n",
			want: []string{"demo.yaml: document 3 (Service demo/web): spec.ports[0].port: 70000 is out of range 1-65535"},
		},
		{
			name: "a misspelt kind refuses the file, rather than drop the object",
			data: strings.Replace(svcHead, "kind: Service", "kind: Servcie", 1) + "spec:\n  ports: [{port: 80}]\n" +
				"---\napiVersion: discovery.k8s.io/v1\nkind: endpointslice\nmetadata: {name: web-1}\n",
			want: []string{
				`demo.yaml: document 1 (Servcie demo/web): kind: "Servcie" is not a kind; did you mean Service?`,
				`demo.yaml: document 2 (endpointslice default/web-1): kind: "endpointslice" is not a kind; did you mean EndpointSlice?`,
			},
		},
		{
			name: "a kind the proxy reads at another apiVersion refuses the file, rather than drop the object",
			data: strings.Replace(svcHead, "apiVersion: v1", "apiVersion: v2", 1) + "spec:\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(sliceHead, "discovery.k8s.io/v1", "discovery.k8s.io/v1beta1", 1) + "addressType: IPv4\n",
			want: []string{
				`demo.yaml: document 1 (Service demo/web): apiVersion: "v2" is not a version of Service this proxy reads: want v1`,
				`demo.yaml: document 2 (EndpointSlice demo/web-1): apiVersion: "discovery.k8s.io/v1beta1" is not a version of EndpointSlice this proxy reads: want discovery.k8s.io/v1`,
			},
		},
		{
			name: "unknown field (strict)",
			data: svcHead + "spec:\n  ports: [{port: 80}]\n  prots: []\n",
			want: []string{"demo.yaml: document 1 (Service demo/web): spec.prots: unknown field"},
		},
		{
			name: "duplicated field (strict), with the line in the file",
			data: "# header\n---\n" + svcHead + "spec:\n  ports:\n  - port: 80\n    port: 81\n",
			want: []string{`demo.yaml: document 1 (Service demo/web): yaml: unmarshal errors: line 11: key "port" already set in map`},
		},
		{
			name: "YAML syntax error, with the line in the file",
			data: good + "---\nkind: [\n",
			want: []string{"demo.yaml: document 2: yaml: line 9: did not find expected node content"},
		},
		{
			name: "wrong type, named with its list index",
			data: svcHead + "spec:\n  ports: [{name: a, port: 80}, {name: b, port: http}]\n",
			want: []string{`demo.yaml: document 1 (Service demo/web): spec.ports[1].port: "http" is a string; want int32`},
		},
		{
			name: "a YAML 1.1 boolean where a string goes",
			data: svcHead + "spec:\n  ports: [{name: y, port: 80}]\n",
			want: []string{`demo.yaml: document 1 (Service demo/web): spec.ports[0].name: "y" is a boolean; want string (YAML reads a plain y as a boolean: quote it, "y")`},
		},
		{
			name: "wrong type in a JSON object",
			data: `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": [80]}]}}`,
			want: []string{`demo.yaml: document 1 (Service default/web): spec.ports[0].port: the value is a list; want int32`},
		},
		{
			name: "no kind",
			data: "apiVersion: v1\nmetadata: {name: web}\n",
			want: []string{"demo.yaml: document 1 (default/web): apiVersion and kind are required"},
		},
		{
			name: "metadata",
			data: "apiVersion: v1\nkind: Service\nmetadata: {namespace: Demo}\nspec: {ports: [{port: 80}]}\n---\n" +
				"apiVersion: v1\nkind: Service\nmetadata: {name: Web_1}\nspec: {ports: [{port: 80}]}\n",
			want: []string{
				"demo.yaml: document 1 (Service): metadata.name: is required",
				`demo.yaml: document 1 (Service): metadata.namespace: "Demo" is invalid`,
				`demo.yaml: document 2 (Service default/Web_1): metadata.name: "Web_1" is invalid`,
			},
		},
		{
			name: "ports",
			data: svcHead + `spec:
  type: ClusterIP
  ports:
  - port: 80
  - {name: http, port: 0, protocol: tcp}
  - {name: http, port: 81, nodePort: 30081}
  - {name: dns, port: 81}
  - {name: Bad_Name, port: 82, nodePort: 70000}
`,
			want: []string{
				"spec.ports[0].name: is required when a Service has more than one port",
				`spec.ports[1].protocol: unsupported protocol "tcp" (want TCP, UDP or SCTP)`,
				"spec.ports[1].port: 0 is out of range 1-65535",
				`spec.ports[2].name: duplicate name "http" (also spec.ports[1])`,
				"spec.ports[2].nodePort: may be set only when type is NodePort or LoadBalancer",
				"spec.ports[3]: duplicate port 81/TCP (also spec.ports[2])",
				`spec.ports[4].name: "Bad_Name" is invalid`,
				"spec.ports[4].nodePort: 70000 is out of range 1-65535",
				"spec.ports[4].nodePort: may be set only when type is NodePort or LoadBalancer",
			},
		},
		{
			name: "no ports",
			data: svcHead + "spec: {type: LoadBalancer}\n",
			want: []string{"demo.yaml: document 1 (Service demo/web): spec.ports: at least one port is required"},
		},
		{
			name: "addresses and policies",
			data: svcHead + `spec:
  type: Magic
  clusterIP: 10.0.0.300
  clusterIPs: [10.0.0.1, 10.0.0.2, fd00::1]
  externalIPs: [192.0.2.1, 192.0.2.256, 192.0.02.1]
  ports: [{port: 80}]
  sessionAffinity: Sticky
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}
  externalTrafficPolicy: Global
  internalTrafficPolicy: Node
  healthCheckNodePort: 65536
status:
  loadBalancer:
    ingress: [{ip: 198.51.100.300}, {ip: 198.51.100.1, ipMode: Tunnel}]
`,
			want: []string{
				`spec.type: unknown type "Magic"`,
				`spec.clusterIP: "10.0.0.300" is not a valid IP address`,
				`spec.clusterIPs[0]: "10.0.0.1" must equal spec.clusterIP "10.0.0.300"`,
				"spec.clusterIPs: at most two addresses (one per IP family) are allowed, got 3",
				`spec.externalIPs[1]: "192.0.2.256" is not a valid IP address`,
				`spec.externalIPs[2]: "192.0.02.1" has leading zeros, which the API server refuses (write 192.0.2.1)`,
				`spec.sessionAffinity: unknown affinity "Sticky" (want None or ClientIP)`,
				"spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is out of range 1-86400",
				`spec.externalTrafficPolicy: unknown policy "Global"`,
				`spec.internalTrafficPolicy: unknown policy "Node"`,
				"spec.healthCheckNodePort: 65536 is out of range 1-65535",
				`status.loadBalancer.ingress[0].ip: "198.51.100.300" is not a valid IP address`,
				`status.loadBalancer.ingress[1].ipMode: unknown mode "Tunnel" (want VIP or Proxy)`,
			},
		},
		{
			name: "load-balancer source ranges",
			data: svcHead + "spec:\n  type: LoadBalancer\n  loadBalancerSourceRanges: [203.0.113.0/24, 203.0.113.7, 10.0.0.0/33, \" 198.18.0.0/15 \", 198.18.0.1/15, 010.0.0.0/8]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web2", 1) + "spec:\n  type: NodePort\n  loadBalancerSourceRanges: [203.0.113.0/24]\n  ports: [{port: 80, nodePort: 30080}]\n",
			want: []string{
				`document 1 (Service demo/web): spec.loadBalancerSourceRanges[1]: "203.0.113.7" is not a CIDR (want an address range such as 203.0.113.0/24)`,
				`document 1 (Service demo/web): spec.loadBalancerSourceRanges[2]: "10.0.0.0/33" is not a CIDR`,
				`document 1 (Service demo/web): spec.loadBalancerSourceRanges[4]: "198.18.0.1/15" has bits set beyond the prefix length (write 198.18.0.0/15)`,
				`document 1 (Service demo/web): spec.loadBalancerSourceRanges[5]: "010.0.0.0/8" has leading zeros (write 10.0.0.0/8)`,
				"document 2 (Service demo/web2): spec.loadBalancerSourceRanges: may be set only when type is LoadBalancer",
			},
		},
		{
			name: "ip families",
			data: svcHead + "spec:\n  clusterIPs: [10.0.0.1, fd00::1]\n  ipFamilies: [IPv6, IPv4]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web2", 1) + "spec:\n  ipFamilies: [IPv6, IPv6]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web3", 1) + "spec:\n  ipFamilies: [IPv5]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web4", 1) + "spec:\n  clusterIP: 10.0.0.1\n  ipFamilies: [IPv6]\n  ports: [{port: 80}]\n",
			want: []string{
				"document 1 (Service demo/web): spec.ipFamilies[0]: IPv6 does not match spec.clusterIPs[0] 10.0.0.1, an IPv4 address",
				"document 1 (Service demo/web): spec.ipFamilies[1]: IPv4 does not match spec.clusterIPs[1] fd00::1, an IPv6 address",
				"document 2 (Service demo/web2): spec.ipFamilies[1]: IPv6 is given twice",
				`document 3 (Service demo/web3): spec.ipFamilies[0]: unknown IP family "IPv5" (want IPv4 or IPv6)`,
				"document 4 (Service demo/web4): spec.ipFamilies[0]: IPv6 does not match spec.clusterIP 10.0.0.1, an IPv4 address",
			},
		},
		{
			name: "IP family policies the API server refuses",
			data: svcHead + "spec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv6, IPv4]\n  clusterIP: fd00::10\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web2", 1) + "spec:\n  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [10.0.0.2]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web3", 1) + "spec:\n  ipFamilyPolicy: SingleStack\n  clusterIPs: [10.0.0.3, fd00::3]\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web4", 1) + "spec:\n  ipFamilyPolicy: RequireDualstack\n  ports: [{port: 80}]\n" +
				// Served as they are: headless, and both families given.
				"---\n" + strings.Replace(svcHead, "web", "web5", 1) + "spec:\n  ipFamilyPolicy: RequireDualStack\n  clusterIP: None\n  ports: [{port: 80}]\n" +
				"---\n" + strings.Replace(svcHead, "web", "web6", 1) + "spec:\n  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [10.0.0.6, fd00::6]\n  ports: [{port: 80}]\n",
			want: []string{
				"document 1 (Service demo/web): spec.clusterIP: ipFamilyPolicy RequireDualStack needs a cluster IP of each family, and there is no IPv4 one",
				"document 2 (Service demo/web2): spec.clusterIPs: ipFamilyPolicy RequireDualStack needs a cluster IP of each family, and there is no IPv6 one",
				"document 3 (Service demo/web3): spec.ipFamilyPolicy: SingleStack allows one cluster IP, and spec.clusterIPs has two",
				`document 4 (Service demo/web4): spec.ipFamilyPolicy: unknown policy "RequireDualstack" (want SingleStack, PreferDualStack or RequireDualStack)`,
			},
		},
		{
			name: "cluster IPs of one family",
			data: svcHead + "spec:\n  clusterIPs: [10.0.0.1, 10.0.0.2]\n  ports: [{port: 80}]\n",
			want: []string{"spec.clusterIPs: the two addresses must be of different IP families"},
		},
		{
			name: "endpoint slice",
			data: `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1}
addressType: IPv4
ports:
- {name: http, port: 65536}
- {name: http, port: 80, protocol: ICMP}
endpoints:
- addresses: [fd00::1]
- addresses: []
- addresses: [10.0.0.1/24]
- addresses: ["::ffff:10.0.0.2"]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv9
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-3, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints:
- addresses: ["::ffff:10.0.0.3"]
`,
			want: []string{
				"document 1 (EndpointSlice default/web-1): ports[0].port: 65536 is out of range 1-65535",
				`document 1 (EndpointSlice default/web-1): ports[1].name: duplicate name "http" (also ports[0])`,
				`document 1 (EndpointSlice default/web-1): ports[1].protocol: unsupported protocol "ICMP"`,
				"document 1 (EndpointSlice default/web-1): endpoints[0].addresses[0]: fd00::1 is not an IPv4 address",
				"document 1 (EndpointSlice default/web-1): endpoints[1].addresses: at least one address is required",
				`document 1 (EndpointSlice default/web-1): endpoints[2].addresses[0]: "10.0.0.1/24" is not a valid IP address`,
				"document 1 (EndpointSlice default/web-1): endpoints[3].addresses[0]: ::ffff:10.0.0.2 is an IPv4-mapped IPv6 address, which the API server refuses (write 10.0.0.2)",
				`demo.yaml: document 2 (EndpointSlice default/web-2): addressType: unknown address type "IPv9"`,
				"demo.yaml: document 3 (EndpointSlice default/web-3): endpoints[0].addresses[0]: ::ffff:10.0.0.3 is an IPv4-mapped address, not an IPv6 address: the API server refuses it here (write 10.0.0.3 in an IPv4 EndpointSlice)",
			},
		},
		{
			// Refused since 1.36 (StrictIPCIDRValidation) in every field
			// the proxy reads an address from, as in an endpoint.
			name: "IPv4-mapped addresses in a Service",
			data: svcHead + `spec:
  type: LoadBalancer
  clusterIP: "::ffff:10.0.0.1"
  clusterIPs: ["::ffff:10.0.0.1"]
  externalIPs: [192.0.2.1, "::ffff:192.0.2.2"]
  ports: [{port: 80, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [{ip: "::ffff:198.51.100.1"}]
`,
			want: []string{
				"document 1 (Service demo/web): spec.clusterIP: ::ffff:10.0.0.1 is an IPv4-mapped IPv6 address, which the API server refuses (write 10.0.0.1)",
				"document 1 (Service demo/web): spec.clusterIPs[0]: ::ffff:10.0.0.1 is an IPv4-mapped IPv6 address, which the API server refuses (write 10.0.0.1)",
				"document 1 (Service demo/web): spec.externalIPs[1]: ::ffff:192.0.2.2 is an IPv4-mapped IPv6 address, which the API server refuses (write 192.0.2.2)",
				"document 1 (Service demo/web): status.loadBalancer.ingress[0].ip: ::ffff:198.51.100.1 is an IPv4-mapped IPv6 address, which the API server refuses (write 198.51.100.1)",
			},
		},
		{
			name: "duplicate objects name both documents, also inside a List",
			data: good + "---\n" + sliceHead + "addressType: IPv4\n---\n" +
				"apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(strings.TrimSpace(sliceHead), "\n", "\n  ") + "\n  addressType: IPv4\n",
			want: []string{"demo.yaml: document 3 (EndpointSlice demo/web-1): items[0]: duplicate of document 2"},
		},
		{
			name: "duplicates of invalid objects are reported too",
			data: svcHead + "spec: {ports: [{port: 0}]}\n---\n" + good,
			want: []string{
				"demo.yaml: document 1 (Service demo/web): spec.ports[0].port: 0 is out of range 1-65535",
				"demo.yaml: document 2 (Service demo/web): duplicate of document 1",
			},
		},
		{
			name: "node port used twice",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {type: NodePort, ports: [{port: 80, nodePort: 30080}]}\n---\n" +
				"apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {type: NodePort, ports: [{port: 81, nodePort: 30080}]}\n",
			want: []string{"demo.yaml: document 2 (Service default/b): spec.ports[0].nodePort: node port 30080/TCP is also used by Service default/a (document 1)"},
		},
		{
			// In a cluster one allocator gives node ports and health-check
			// node ports alike: a port both ask for would answer the load
			// balancer's checks of one Service with the other's endpoints,
			// or not be served at all.
			name: "health check node port used twice",
			data: lbService("a", 30100, 30080) + "---\n" + lbService("b", 30100, 30081),
			want: []string{"demo.yaml: document 2 (Service default/b): spec.healthCheckNodePort: health check node port 30100 is also the health check node port of Service default/a (document 1)"},
		},
		{
			name: "health check node port on another Service's node port",
			data: lbService("a", 30100, 30080) + "---\n" + lbService("b", 30080, 30081),
			want: []string{"demo.yaml: document 2 (Service default/b): spec.healthCheckNodePort: health check node port 30080 is also spec.ports[0].nodePort of Service default/a (document 1)"},
		},
		{
			name: "node port on another Service's health check node port",
			data: lbService("a", 30100, 30080) + "---\n" + "apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {type: NodePort, ports: [{port: 81, nodePort: 30100}]}\n",
			want: []string{"demo.yaml: document 2 (Service default/b): spec.ports[0].nodePort: node port 30100/TCP is also the health check node port of Service default/a (document 1)"},
		},
		{
			name: "health check node port on the Service's own node port",
			data: lbService("a", 30080, 30080),
			want: []string{"demo.yaml: document 1 (Service default/a): spec.healthCheckNodePort: health check node port 30080 is also spec.ports[0].nodePort of this Service"},
		},
		{
			name: "a JSON array is not an object",
			data: `[{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}]`,
			want: []string{"demo.yaml: document 1: is a list, not an object with apiVersion and kind (several objects go one after another, or in a kind: List with items)"},
		},
		{
			name: "plain text is not an object",
			data: "just some text\n",
			want: []string{"demo.yaml: document 1: is a string, not an object"},
		},
		{
			name: "a cluster IP and port used twice",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: 198.18.0.10, ports: [{port: 80}]}\n---\n" +
				"apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {clusterIPs: [198.18.0.10, 'fd5e:b1b5::10'], ports: [{name: dns, port: 53, protocol: UDP}, {name: web, port: 80}]}\n",
			want: []string{"demo.yaml: document 2 (Service default/b): spec.ports[1]: 198.18.0.10:80/TCP is also served by Service default/a (document 1): cluster IP 198.18.0.10 is given to both"},
		},
		{
			name: "errors inside a List name the item",
			data: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web}\n  spec: {ports: [{port: 80, nodePot: 1}]}\n" +
				"- {apiVersion: v1, kind: List, items: []}\n",
			want: []string{
				"demo.yaml: document 1 (Service default/web): items[0].spec.ports[0].nodePot: unknown field",
				"demo.yaml: document 1 (List): items[1]: a List may not hold another list",
			},
		},
		{
			name: "text after JSON objects",
			data: "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}, \"spec\": {\"ports\": [{\"port\": 80}]}}\n\nthis is not JSON\n",
			want: []string{"demo.yaml: document 2: line 3: invalid JSON after object 1: invalid character 'h' in literal true (expecting 'r')"},
		},
		{
			name: "a JSON object half written",
			data: "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}, \"spec\": {\"ports\": [{\"port\": 80}]}}\n" +
				"{\"apiVersion\": \"v1\", \"kind\": \"Serv",
			want: []string{"demo.yaml: document 2: line 2: invalid JSON after object 1: "},
		},
		{
			name: "errors in a JSON stream name the object's document",
			data: "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}, \"spec\": {\"ports\": [{\"port\": 80}]}}\n" +
				"{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"dns\"}, \"spec\": {\"ports\": [{\"port\": 0}]}}\n",
			want: []string{"demo.yaml: document 2 (Service default/dns): spec.ports[0].port: 0 is out of range 1-65535"},
		},
		{
			name: "bad document separator",
			data: good + "--- !!map\n",
			want: []string{"demo.yaml: document 1: invalid Yaml document separator: !!map"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := ParseManifests("demo.yaml", []byte(tc.data))
			if err == nil {
				t.Fatal("no error")
			}
			for _, e := range flatten(err) {
				var oe *ObjectError
				if !errors.As(e, &oe) || oe.File != "demo.yaml" || oe.Document < 1 {
					t.Errorf("%v: not an ObjectError with file and document", e)
				}
			}
			checkProblems(t, flatten(err), tc.want)
		})
	}
}

// TestTypeErrorLine: a value of the wrong type is reported with the line
// it is on in the file, not only where its document starts.
func TestTypeErrorLine(t *testing.T) {
	data := demoManifest + "---\napiVersion: v1\nkind: Service\nmetadata: {name: bad}\nspec:\n  ports:\n  - port: 80\n    name: a\n  - port: eighty\n    name: b\n"
	_, _, _, err := ParseManifests("demo.yaml", []byte(data))
	var oe *ObjectError
	if !errors.As(err, &oe) {
		t.Fatalf("got %v, want an ObjectError", err)
	}
	want := strings.Count(data[:strings.Index(data, "port: eighty")], "\n") + 1
	if oe.Line != want || oe.Field != "spec.ports[1].port" {
		t.Fatalf("got line %d field %q (%v), want line %d field spec.ports[1].port", oe.Line, oe.Field, err, want)
	}
}

// TestFindingsNameTheirLine: warnings and errors about a field give the
// field's line, in YAML and in a JSON stream, so an editor can jump to it.
func TestFindingsNameTheirLine(t *testing.T) {
	lineOf := func(data, text string, nth int) int {
		at := -1
		for range nth {
			at += 1 + strings.Index(data[at+1:], text)
		}
		return strings.Count(data[:at], "\n") + 1
	}
	yamlData := `# two Services
apiVersion: v1
kind: Service
metadata: {name: a}
spec:
  type: NodePort
  ports:
  - name: http
    port: 80
    nodePort: 30080
  - name: admin
    port: 81
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec:
  type: NodePort
  ports:
  - port: 82
    nodePort: 30080
`
	jsonData := `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"},
 "spec": {"ports": [{"port": 80}]}}
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"},
 "spec": {
   "selector": {"app": "b"},
   "ports": [{"port": 80}]}}
`
	sharedHC := lbService("a", 30100, 30080) + "---\n" + lbService("b", 30100, 30081)
	tests := []struct {
		name, data string
		err        bool
		field      string
		line       int
	}{
		{"a warning in YAML", yamlData, false, "spec.ports[1].nodePort", lineOf(yamlData, "- name: admin", 1)},
		{"a cross-check error in YAML", yamlData, true, "spec.ports[0].nodePort", lineOf(yamlData, "nodePort: 30080", 2)},
		{"a warning in a JSON stream", jsonData, false, "spec.selector", lineOf(jsonData, `"selector"`, 1)},
		{"a health check node port used twice", sharedHC, true, "spec.healthCheckNodePort", lineOf(sharedHC, "healthCheckNodePort: 30100", 2)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, warnings, err := ParseManifests("demo.yaml", []byte(tc.data))
			found := warnings
			if tc.err {
				found = flatten(err)
			}
			for _, e := range found {
				var oe *ObjectError
				if errors.As(e, &oe) && oe.Field == tc.field {
					if oe.Line != tc.line {
						t.Fatalf("%s: line %d, want %d", e, oe.Line, tc.line)
					}
					return
				}
			}
			t.Fatalf("nothing about %s in %v (error %v)", tc.field, warnings, err)
		})
	}
}

func TestLocate(t *testing.T) {
	data := "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web}\n  spec: {externalIPs: [169.254.169.254], ports: [{port: 80}]}\n"
	m, err := parseManifests(context.Background(), "demo.yaml", []byte(data), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, problems := BuildSnapshot(m.services, m.slices, Options{AllowNoClusterIP: true})
	if len(problems) != 1 {
		t.Fatalf("got %v, want one problem", problems)
	}
	got := m.locate(problems[0])
	want := "demo.yaml: document 1 (Service default/web): items[0].spec.externalIPs[0]: address refused: 169.254.169.254 is link-local"
	if got.Error() != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// TestYAMLSyntaxErrorLine: YAML that does not parse, deep in a file of many
// documents, is reported on its own line, in the message and in Line alike.
func TestYAMLSyntaxErrorLine(t *testing.T) {
	data := string(generatedManifest(300, 5))
	// svc-250's slice is document 502.
	doc := strings.Index(data, "  name: svc-250-abc\n")
	lineOf := func(text string) int {
		return strings.Count(data[:doc+strings.Index(data[doc:], text)], "\n") + 1
	}
	tests := []struct {
		name, line, edit string
		below            int // the bad line's, below line's
		reason           string
	}{
		// The parser's own messages: go-yaml counts their lines from 0.
		{"a key indented wrong", "addressType: IPv4\n", " addressType: IPv4\n", 0, "did not find expected key"},
		{"a map in a list", "ports:\n", "ports:\n  - p: 1\n  q: 2\n", 2, "did not find expected '-' indicator"},
		// The scanner's: from 1.
		{"a character that starts nothing", "addressType: IPv4\n", "addressType: @IPv4\n", 0, "found character that cannot start any token"},
		// At the end of the document: its last line, not the next.
		{"an unclosed map at the end", "  conditions: {ready: true}\n---\n", "  conditions: {ready: true\n---\n", 0, "did not find expected ',' or '}'"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			line := lineOf(tc.line) + tc.below
			edited := data[:doc] + strings.Replace(data[doc:], tc.line, tc.edit, 1)
			_, _, _, err := ParseManifests("big.yaml", []byte(edited))
			errs := flatten(err)
			var oe *ObjectError
			if len(errs) != 1 || !errors.As(errs[0], &oe) {
				t.Fatalf("got %v, want one ObjectError", err)
			}
			want := fmt.Sprintf("big.yaml: document 502: yaml: line %d: %s", line, tc.reason)
			if oe.Error() != want || oe.Line != line {
				t.Fatalf("got  %s (line %d)\nwant %s (line %d)", oe, oe.Line, want, line)
			}
		})
	}
}

// TestLinesAfterSeparatorRuns: documents separated by runs of "---" lines
// (two files joined with cat, one ending and the next starting with "---"),
// or a file that starts with one, are numbered as documents are counted
// (non-empty ones, from 1) and every problem names its real line in the
// file, in Line and in a YAML message alike.
func TestLinesAfterSeparatorRuns(t *testing.T) {
	docs := []string{
		// 1: a warning about a field.
		"apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: x}\nspec:\n  clusterIP: 198.18.1.1\n  selector: {app: a}\n  ports: [{port: 80}]\n",
		// 2: a warning about the whole document.
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n",
		// 3: an unknown field.
		"apiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: x}\nspec:\n  clusterIP: 198.18.1.2\n  ports:\n  - port: 80\n    protocl: TCP\n",
		// 4: YAML that does not parse.
		"apiVersion: v1\nkind: Service\nmetadata: {name: d, namespace: x}\nspec:\n  clusterIP: 198.18.1.4\n  ports: [{port: 80, protocol: TCP}\n",
		// 5: a tab where YAML takes none.
		"apiVersion: v1\nkind: Service\nmetadata: {name: e, namespace: x}\nspec:\n  clusterIP: 198.18.1.5\n  ports:\n\t- port: 80\n",
	}
	// Each problem: its document, and the text of the line it is on.
	want := []struct {
		doc  int
		line string
	}{
		{1, "  selector: {app: a}\n"},
		{2, "apiVersion: v1\nkind: ConfigMap\n"},
		{3, "    protocl: TCP\n"},
		{4, "  ports: [{port: 80, protocol: TCP}\n"},
		{5, "\t- port: 80\n"},
	}
	tests := []struct{ name, lead, sep string }{
		{"one separator", "", "---\n"},
		{"a separator first", "---\n", "---\n"},
		{"two separators first", "---\n---\n", "---\n"},
		{"two separators", "", "---\n---\n"},
		{"three separators", "", "---\n---\n---\n"},
		{"separators with comments and blank lines", "--- # start\n\n", "---\n# nothing\n--- # again\n\n---\n"},
		{"a separator first, CRLF", "---\r\n", "---\r\n---\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.lead + strings.Join(docs, tc.sep)
			crlf := strings.Contains(tc.sep, "\r\n")
			if crlf {
				data = strings.ReplaceAll(strings.ReplaceAll(data, "\r\n", "\n"), "\n", "\r\n")
			}
			_, _, warnings, err := ParseManifests("cat.yaml", []byte(data))
			problems := append(slices.Clone(warnings), flatten(err)...)
			if len(problems) != len(want) {
				t.Fatalf("got %d problems, want %d: %v", len(problems), len(want), problems)
			}
			for _, e := range problems {
				var oe *ObjectError
				if !errors.As(e, &oe) || oe.Document < 1 || oe.Document > len(want) {
					t.Fatalf("%v: not an ObjectError of a document 1-%d", e, len(want))
				}
				text := want[oe.Document-1].line
				if crlf {
					text = strings.ReplaceAll(text, "\n", "\r\n")
				}
				line := strings.Count(data[:strings.Index(data, text)], "\n") + 1
				if oe.Line != line {
					t.Errorf("%v: line %d, want %d", e, oe.Line, line)
				}
				if m := yamlLine.FindString(oe.Err.Error()); m != "" && m != fmt.Sprintf("line %d", line) {
					t.Errorf("%v: message names %s, want line %d", e, m, line)
				}
			}
		})
	}

	t.Run("a separator the reader refuses, in a run", func(t *testing.T) {
		data := docs[0] + "---\n---\n--- !!map\n" + docs[1]
		_, _, _, err := ParseManifests("cat.yaml", []byte(data))
		var oe *ObjectError
		if !errors.As(err, &oe) || oe.Line != strings.Count(docs[0], "\n")+3 || oe.Document != 2 {
			t.Fatalf("got %v (line %d), want document 2 on line %d", err, oe.Line, strings.Count(docs[0], "\n")+3)
		}
	})
}

// TestParseManifestsAffinityTimeoutBounds: the manifest checks take the
// API server's bounds of sessionAffinityConfig.clientIP.timeoutSeconds,
// 1 to 86400 ("must be >0 && <=86400"), and refuse 0 and 86401.
func TestParseManifestsAffinityTimeoutBounds(t *testing.T) {
	for secs, ok := range map[int]bool{0: false, 1: true, 86400: true, 86401: false} {
		data := fmt.Sprintf("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  ports: [{port: 80}]\n"+
			"  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: %d}}\n", secs)
		_, _, _, err := ParseManifests("demo.yaml", []byte(data))
		switch want := fmt.Sprintf("timeoutSeconds: %d is out of range 1-86400", secs); {
		case ok && err != nil:
			t.Errorf("timeoutSeconds %d refused: %v", secs, err)
		case !ok && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("timeoutSeconds %d: %v, want an error containing %q", secs, err, want)
		}
	}
}
