package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"reflect"
	"runtime"
	"testing"
)

// TestParseManifestsHoldsLittleMoreThanItsObjects: what a parse of a
// generated file of Services and EndpointSlices keeps (its objects, where
// they were found, and what the next read is to reuse) is at most five
// times the file's size, the file itself not counted. Each document's
// object was kept twice (served, and a copy for the next read), and the
// document's text twice more (the YAML reader's copy, for finding a
// field's line, and the key of the next read's cache): 6.8 times this
// file, 8.6 times a 45 MB one (387 MB); now 3.5 and 4.5 times. The peak
// heap of a read is about twice what it keeps.
func TestParseManifestsHoldsLittleMoreThanItsObjects(t *testing.T) {
	data := generatedManifest(500, 60) // 1.9 MB
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	m, err := parseManifests(context.Background(), "big.yaml", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	kept := heap() - before
	runtime.KeepAlive(m)
	t.Logf("a parse of %d bytes keeps %d bytes, %.1f times as many", len(data), kept, float64(kept)/float64(len(data)))
	if limit := 5 * uint64(len(data)); kept > limit {
		t.Errorf("a parse of %d bytes keeps %d bytes, more than %d", len(data), kept, limit)
	}
}

// TestManifestCacheKeepsObjectsAsDecoded: the objects a read keeps for the
// next (docCache) are the decoder's, unchanged by what the read did with
// them (namespaces and slice ports defaulted, validation, the snapshot
// built from them), though the read served those same objects; and a
// second read, which serves them again, gives the same snapshot.
func TestManifestCacheKeepsObjectsAsDecoded(t *testing.T) {
	data := []byte(`apiVersion: v1
kind: Service
metadata: {name: a}
spec:
  clusterIP: 198.18.0.1
  selector: {app: a}
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: a-1
  labels: {kubernetes.io/service-name: a}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [198.19.0.1]}]
---
apiVersion: v1
kind: ServiceList
items:
- metadata: {name: b}
  spec: {clusterIP: 198.18.0.2, ports: [{port: 53, protocol: UDP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- metadata: {name: b-1, labels: {kubernetes.io/service-name: b}}
  addressType: IPv4
  ports: [{protocol: UDP, port: 5353}]
  endpoints: [{addresses: [198.19.0.2]}]
---
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "c"},
  "spec": {"clusterIP": "198.18.0.3", "ports": [{"port": 80}]}}
`)
	l := &loader{name: "m.yaml", path: "m.yaml", opts: Options{AllowLoopback: true, AllowNoClusterIP: true},
		read: func(string) ([]byte, error) { return data, nil }}
	snap, _, err := l.load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 3 {
		t.Fatalf("%d service ports; want 3", snap.Len())
	}
	dec, err := newDecoders()
	if err != nil {
		t.Fatal(err)
	}
	r := &documents{data: data}
	for n := 0; ; n++ {
		chunk, err := r.next()
		if err != nil {
			if n != 5 {
				t.Fatalf("%d documents: %v", n, err)
			}
			break
		}
		if n == 4 { // JSON: the value, without the space after it
			chunk = bytes.TrimSpace(chunk)
		}
		kept, ok := l.docs[docKey(sha256.Sum256(chunk))]
		if !ok {
			t.Fatalf("document %d is not kept", n+1)
		}
		fresh, _, err := dec.yaml.Decode(chunk, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(kept.obj, fresh) {
			t.Errorf("document %d is kept as %#v; decoded, %#v", n+1, kept.obj, fresh)
		}
	}
	l.seen = "" // read it again, from what was kept
	again, changed, err := l.load(context.Background())
	if err != nil || !changed || !sameSnapshot(snap, again) {
		t.Errorf("the second read: changed %v, %v; same snapshot: %v", changed, err, sameSnapshot(snap, again))
	}
}

// TestBuildSnapshotAllocation: building the snapshot of 200 Services of 60
// endpoints each allocates at most 1,400 bytes an endpoint. Each port's
// set of endpoints grew from empty, the per-family lists were grown by
// appends, and every port's set was held until the last port was built:
// 1,814 bytes an endpoint, and the larger part of the proxy's peak when it
// reads a large manifest (VmHWM 1,168 MB of 1,437 before on a 44 MB file
// of 12,000 Services of 60 endpoints, 999 MB now); now 1,115.
func TestBuildSnapshotAllocation(t *testing.T) {
	const services, eps = 200, 60
	m, err := parseManifests(context.Background(), "big.yaml", generatedManifest(services, eps), nil)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	snap, _ := BuildSnapshot(m.services, m.slices, Options{AllowLoopback: true, AllowNoClusterIP: true})
	runtime.ReadMemStats(&after)
	if snap.Len() != services {
		t.Fatalf("%d service ports; want %d", snap.Len(), services)
	}
	per := (after.TotalAlloc - before.TotalAlloc) / (services * eps)
	t.Logf("BuildSnapshot allocates %d bytes an endpoint", per)
	if per > 1400 {
		t.Errorf("BuildSnapshot allocates %d bytes an endpoint, more than 1,400", per)
	}
}
