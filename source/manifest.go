package source

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// decoders decode YAML or JSON into core/v1 and discovery/v1 objects,
// strictly: unknown and duplicated fields are errors, as with
// `kubectl apply --validate=strict`. No defaults are applied.
type decoders struct {
	// yaml reads YAML, and JSON too, since JSON is YAML. Its messages are
	// the ones reported.
	yaml runtime.Decoder
	// json reads the JSON that YAML converts to. For a document that
	// converts without error it decodes what yaml does, without the two
	// further conversions yaml makes (one of them strict); see decode.
	json runtime.Decoder
}

var newDecoders = sync.OnceValues(func() (decoders, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return decoders{}, fmt.Errorf("register core/v1: %w", err)
	}
	if err := discoveryv1.AddToScheme(scheme); err != nil {
		return decoders{}, fmt.Errorf("register discovery/v1: %w", err)
	}
	return decoders{
		yaml: json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
			json.SerializerOptions{Yaml: true, Strict: true}),
		json: json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
			json.SerializerOptions{Strict: true}),
	}, nil
})

// ParseManifests reads the Services and EndpointSlices in data, a YAML
// stream of documents separated by "---" (or a JSON document), exactly what
// `kubectl apply -f` takes: apiVersion v1 Service, discovery.k8s.io/v1
// EndpointSlice, and v1 List, ServiceList and EndpointSliceList holding
// them. name is the file name used in messages.
//
// Objects are decoded strictly with the Kubernetes API types and validated
// (see validate.go); namespaces default to "default". Every problem is
// reported, not just the first: err joins one *ObjectError per problem,
// each naming the file, the document, the object when known and the field,
// with the line of the file it is on. Documents count from 1, and only
// those with content do: one of nothing but blank lines and comments, or
// between two "---" lines in a row, is skipped, as kubectl skips it. Objects of other kinds, and
// Services or slices that are valid but will not do what their author may
// expect, are reported in warnings and do not make err non-nil. A file
// with no content at all yields ErrEmptyManifest. When err is not nil, no
// objects are returned: a file is used whole or not at all.
func ParseManifests(name string, data []byte) (services []*corev1.Service, slices []*discoveryv1.EndpointSlice, warnings []error, err error) {
	m, err := parseManifests(context.Background(), name, data, nil)
	if m == nil {
		return nil, nil, nil, err
	}
	if err != nil {
		return nil, nil, m.warnings, err
	}
	return m.services, m.slices, m.warnings, nil
}

// manifest is what one file holds.
type manifest struct {
	file     string
	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
	warnings []error
	errs     []error
	// origins maps each object to where it was found.
	origins map[objectKey]origin

	dec decoders
	// lines finds the lines of fields in the document with problems.
	lines fieldLines
	// known holds what the documents of the last read decoded to; docs
	// gets what those of this read did, for the next.
	known, docs docCache
}

// docCache maps the text of a document (its docKey) to what it decoded
// to, so that a read after an edit decodes only the documents that
// changed: decoding is most of the cost of a read (YAML is slow to parse),
// and an edit usually changes one document of many. Only what is decoded
// is kept; where the document is, what validation finds and every message
// are worked out again at each read, so that they follow lines inserted
// above it.
//
// The objects are those the read served, not copies: nothing changes an
// object once decoded (addService and addSlice default a copy), so the
// next read may serve them again. A copy of each, and the text as the
// key, held a 50 MB file's objects twice and its text once more.
type docCache map[docKey]decoded

// docKey identifies the text of a document: its SHA-256.
type docKey [sha256.Size]byte

// decoded is one document's object, as the decoder returned it. It is
// never changed.
type decoded struct {
	obj runtime.Object
	gvk *schema.GroupVersionKind
}

// objectKey identifies an object within a manifest.
type objectKey struct {
	kind string
	objectRef
}

// origin is where an object was found: its document, the line where that
// starts, and its index within a List (or -1). doc is the document's text
// when the object is the whole document, for finding a field's line.
type origin struct {
	document int
	line     int
	item     int
	doc      []byte
}

// within returns the origin of item i of a List found at o.
func (o origin) within(i int) origin { return origin{document: o.document, line: o.line, item: i} }

func (o origin) String() string {
	if o.item < 0 {
		return fmt.Sprintf("document %d", o.document)
	}
	return fmt.Sprintf("document %d items[%d]", o.document, o.item)
}

// fieldPrefix is the path of the object within its document.
func (o origin) fieldPrefix() string {
	if o.item < 0 {
		return ""
	}
	return fmt.Sprintf("items[%d]", o.item)
}

// locate fills in the file, document and field prefix of an ObjectError that
// BuildSnapshot reported about an object of m. Other errors are returned as
// they are.
func (m *manifest) locate(err error) error {
	var oe *ObjectError
	if !errors.As(err, &oe) || oe.File != "" {
		return err
	}
	o, ok := m.origins[objectKey{oe.Kind, objectRef{oe.Namespace, oe.Name}}]
	if !ok {
		return err
	}
	located := *m.problem(o, oe.Kind, objectRef{oe.Namespace, oe.Name}, oe.Field, oe.Err)
	return &located
}

// problem is an ObjectError about the object found at at. Its line is the
// field's own when the document has the field, else the document's first.
func (m *manifest) problem(at origin, kind string, ref objectRef, field string, err error) *ObjectError {
	e := &ObjectError{
		File: m.file, Document: at.document, Line: at.line, Kind: kind, Namespace: ref.namespace, Name: ref.name,
		Field: joinPath(at.fieldPrefix(), field), Err: err,
	}
	if at.line > 0 && at.doc != nil {
		if l := m.lines.fieldLine(at.doc, field); l > 0 {
			e.Line = at.line + l - 1
		}
	}
	return e
}

func joinPath(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	}
	return prefix + "." + field
}

// parseManifests parses data as ParseManifests does. known is the docs of
// the last read of the file, or nil; the returned manifest's docs are for
// the next. Once ctx is done it stops, with ctx's error and no manifest.
func parseManifests(ctx context.Context, name string, data []byte, known docCache) (*manifest, error) {
	dec, err := newDecoders()
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", name, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrEmptyManifest)
	}
	m := &manifest{file: name, origins: make(map[objectKey]origin), dec: dec, known: known, docs: make(docCache, len(known))}
	r := &documents{data: data}
	// next is the file's line (from 1) that the reader reads next.
	for next, doc := 1, 1; ; {
		// A large file takes seconds: a SIGTERM meanwhile ends the
		// parse, not just what follows it.
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Only the problems of one document are found at a time: the
		// nodes of the last are let go.
		m.lines.reset()
		at := origin{document: doc, item: -1}
		chunk, err := r.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			at.line = badSeparator(data, next)
			m.errs = append(m.errs, &ObjectError{File: name, Document: doc, Line: at.line, Err: err})
			break
		}
		chunk, at.line, next = documentAt(chunk, next)
		if len(chunk) == 0 {
			continue // separators only
		}
		var values []jsonValue
		var badLine int
		if utilyaml.IsJSONBuffer(chunk) {
			values, badLine, err = jsonValues(chunk)
		}
		if values == nil { // YAML
			at.doc = chunk
			if m.yamlDocument(at, chunk) {
				doc++
			}
			continue
		}
		for _, v := range values {
			m.document(origin{document: doc, line: at.line + v.line, item: -1, doc: v.data}, v.data, nil, sha256.Sum256(v.data))
			doc++
		}
		if err != nil {
			line := at.line + badLine
			m.errs = append(m.errs, &ObjectError{File: name, Document: doc, Line: line, Err: fmt.Errorf("line %d: %w", line, err)})
			break
		}
	}
	m.crossCheck()
	m.lines.reset() // BuildSnapshot comes next: it is not to hold a document's nodes
	inFileOrder(m.warnings)
	inFileOrder(m.errs)
	return m, errors.Join(m.errs...)
}

// jsonValue is one JSON value of a document, and the line it starts on,
// counted from the document's first line.
type jsonValue struct {
	data []byte
	line int
}

// jsonValues splits a document that is a stream of JSON objects, as
// `kubectl apply -f` reads a JSON file, into its values; each is then a
// document of its own. A document that is not JSON (its first value does
// not parse as JSON: YAML, which may also start with "{") yields no values.
// After a first good value, anything that does not parse is an error, on
// line badLine of the document (counted from 0), so that a second object an
// editor has half written, or trailing text, is not silently dropped.
func jsonValues(doc []byte) (values []jsonValue, badLine int, err error) {
	if !utilyaml.IsJSONBuffer(doc) {
		return nil, 0, nil
	}
	d := stdjson.NewDecoder(bytes.NewReader(doc))
	for {
		var raw stdjson.RawMessage
		rest := doc[d.InputOffset():]
		err := d.Decode(&raw)
		if err == io.EOF {
			return values, 0, nil
		}
		// The value's first line, not the whitespace before it.
		start := len(doc) - len(bytes.TrimLeft(rest, " \t\r\n"))
		line := bytes.Count(doc[:start], []byte("\n"))
		if err != nil {
			if values == nil {
				return nil, 0, nil
			}
			return values, line, fmt.Errorf("invalid JSON after object %d: %w", len(values), err)
		}
		// The value's own bytes in doc, which raw copies.
		end := int(d.InputOffset())
		values = append(values, jsonValue{data: doc[start:end:end], line: line})
	}
}

// documents splits a file into the chunks utilyaml.YAMLReader reads from
// it, byte for byte, but without copying: a chunk is a slice of data
// whenever it is the same bytes, that is unless a line in it ends in "\r\n"
// (the reader ends every line with "\n") or the file's last line has no
// "\n". A 50 MB file was held twice over by the origins of its objects,
// as the reader's chunks.
type documents struct {
	data []byte
	off  int // where the next line starts
}

// next returns the next chunk, as YAMLReader.Read does: its error for a
// separator followed by other than a comment, io.EOF after the last.
func (r *documents) next() ([]byte, error) {
	start, exact := r.off, true
	for {
		if r.off >= len(r.data) {
			if r.off > start {
				return r.chunk(start, r.off, exact), nil
			}
			return nil, io.EOF
		}
		line, end := r.data[r.off:], len(r.data)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, end = line[:i], r.off+i+1
			if cut, ok := bytes.CutSuffix(line, []byte("\r")); ok {
				line, exact = cut, false
			}
		} else {
			exact = false // the reader ends it with "\n"
		}
		if rest, ok := bytes.CutPrefix(line, []byte(yamlSeparator)); ok {
			if rest = bytes.TrimSpace(rest); len(rest) > 0 && rest[0] != '#' {
				// The reader's own error, for its message.
				sep := append(bytes.Clone(line), '\n')
				_, err := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(sep))).Read()
				return nil, err
			}
			if r.off > start {
				chunk := r.chunk(start, r.off, exact)
				r.off = end
				return chunk, nil
			}
		}
		r.off = end
	}
}

// chunk returns data[start:end] as the reader returns it: each line ending
// in "\n" alone. exact says it already is.
func (r *documents) chunk(start, end int, exact bool) []byte {
	if exact {
		return r.data[start:end:end]
	}
	c := bytes.ReplaceAll(r.data[start:end], []byte("\r\n"), []byte("\n"))
	if !bytes.HasSuffix(c, []byte("\n")) {
		c = append(c, '\n')
	}
	return c
}

// documentAt places a chunk that YAMLReader returned, which starts on line
// start of the file: it returns the document the chunk holds, the line
// where that starts and the line the reader reads after it.
//
// The reader returns each line it reads in a chunk, but for the separator
// that ends one ("---" after a line of content), which it drops. A
// separator it meets before any content starts the chunk instead, so a
// file that starts with "---", or a run of them ("---" ending one file
// joined to another that starts with one), gives chunks that start with a
// separator, and chunks that are nothing else ("---\n"). The document is
// what follows that separator, and the line is counted past it, so that
// lines are the file's whatever separators come before. The reader ends
// each line it returns with "\n" (one "\r\n" or "\n" in the file).
func documentAt(chunk []byte, start int) (doc []byte, line, next int) {
	next = start + bytes.Count(chunk, []byte("\n")) + 1 // and the separator that ended it
	if bytes.HasPrefix(chunk, []byte(yamlSeparator)) {
		_, chunk, _ = bytes.Cut(chunk, []byte("\n"))
		start++
	}
	return chunk, start, next
}

// yamlSeparator starts a line that separates YAML documents, as YAMLReader
// reads them.
const yamlSeparator = "---"

// badSeparator returns the line (from 1) of the first separator YAMLReader
// refuses (one followed by other than a comment) on or after line from, or
// from.
func badSeparator(data []byte, from int) int {
	lines := bytes.Split(data, []byte("\n"))
	for i := from - 1; i >= 0 && i < len(lines); i++ {
		rest, ok := bytes.CutPrefix(lines[i], []byte(yamlSeparator))
		if rest = bytes.TrimSpace(rest); ok && len(rest) > 0 && rest[0] != '#' {
			return i + 1
		}
	}
	return from
}

// yamlLine matches the line numbers in YAML parser messages, which count
// from the start of the document.
var yamlLine = regexp.MustCompile(`\bline ([0-9]+)\b`)

// yamlParserError matches the messages of go-yaml's parser, as against its
// scanner's: it counts their lines from 0, where it counts the scanner's,
// and its decoder's, from 1 (see fail in go.yaml.in/yaml/v2's decode.go).
// A parser error's line is where the parser found what it did not expect.
var yamlParserError = regexp.MustCompile(`\byaml: line [0-9]+: (did not find expected (<document start>|node content|key|'-' indicator|',' or '\]'|',' or '\}')|found undefined tag handle|found incompatible YAML document|found duplicate %(TAG|YAML) directive)$`)

// fileLines rewrites the line numbers in a YAML parser message to count from
// the start of the file, and puts the message on one line. line is the
// first line it names, counted from the start of the file, or 0.
func (m *manifest) fileLines(msg string, at origin) (_ string, line int) {
	msg = strings.Join(strings.Fields(msg), " ")
	if at.line <= 0 || at.item >= 0 {
		return msg, 0
	}
	parser := yamlParserError.MatchString(msg)
	last := m.lines.lastLine(at.doc)
	msg = yamlLine.ReplaceAllStringFunc(msg, func(s string) string {
		n, err := strconv.Atoi(strings.TrimPrefix(s, "line "))
		if err != nil {
			return s
		}
		if parser {
			n++
		}
		if last > 0 && n > last {
			// The end of the document (an unclosed list, say): name
			// its last line, not the one after it.
			n = last
		}
		if line == 0 {
			line = at.line + n - 1
		}
		return fmt.Sprintf("line %d", at.line+n-1)
	})
	return msg, line
}

// yamlDocument decodes a YAML document found at at, and reports false when
// it holds nothing but comments and blank lines (or an explicit null): it
// then does not count.
func (m *manifest) yamlDocument(at origin, data []byte) bool {
	key := docKey(sha256.Sum256(data))
	if _, ok := m.known[key]; ok {
		m.document(at, data, nil, key)
		return true
	}
	j, err := sigsyaml.YAMLToJSONStrict(data)
	switch {
	case err != nil:
		// The decoder says what is wrong, unless the document is
		// empty but for a duplicated key of nothing (which the strict
		// conversion alone refuses).
		if empty(data) {
			return false
		}
		j = nil
	case string(bytes.TrimSpace(j)) == "null":
		return false
	}
	m.document(at, data, j, key)
	return true
}

// empty reports whether a YAML document holds nothing but comments and
// blank lines (or an explicit null).
func empty(doc []byte) bool {
	j, err := utilyaml.ToJSON(doc)
	return err == nil && string(bytes.TrimSpace(j)) == "null"
}

// decode decodes data, a document or an item of a List; j is data
// converted to JSON, or nil; key is a whole document's docKey. A whole
// document that decoded at the last read is not decoded again.
//
// The YAML decoder converts data to JSON twice (once strictly, to find
// duplicated keys) and decodes that. A document that converts strictly
// without error is decoded from its JSON instead, which comes to the same;
// only a document that does not decode goes to the YAML decoder, for its
// messages.
func (m *manifest) decode(at origin, data, j []byte, key docKey) (runtime.Object, *schema.GroupVersionKind, error) {
	if at.item < 0 {
		if d, ok := m.known[key]; ok {
			m.docs[key] = d
			return d.obj, d.gvk, nil
		}
	}
	if j == nil {
		var err error
		if j, err = sigsyaml.YAMLToJSONStrict(data); err != nil {
			return m.dec.yaml.Decode(data, nil, nil)
		}
	}
	obj, gvk, err := m.dec.json.Decode(j, nil, nil)
	if err != nil {
		return m.dec.yaml.Decode(data, nil, nil)
	}
	if at.item < 0 {
		switch obj.(type) {
		case *corev1.Service, *discoveryv1.EndpointSlice, *corev1.ServiceList, *discoveryv1.EndpointSliceList:
			m.docs[key] = decoded{obj, gvk}
		}
	}
	return obj, gvk, nil
}

// document decodes one document, or one item of a List; j is data
// converted to JSON, or nil; key is a whole document's docKey.
func (m *manifest) document(at origin, data, j []byte, key docKey) {
	obj, gvk, err := m.decode(at, data, j, key)
	if err != nil {
		m.decodeError(at, data, obj, err)
		return
	}
	switch o := obj.(type) {
	case *corev1.Service:
		m.addService(at, o)
	case *discoveryv1.EndpointSlice:
		m.addSlice(at, o)
	case *corev1.ServiceList:
		if m.noNesting(at, gvk.Kind) {
			for i := range o.Items {
				m.addService(at.within(i), &o.Items[i])
			}
		}
	case *discoveryv1.EndpointSliceList:
		if m.noNesting(at, gvk.Kind) {
			for i := range o.Items {
				m.addSlice(at.within(i), &o.Items[i])
			}
		}
	case *corev1.List:
		if m.noNesting(at, gvk.Kind) {
			for i, item := range o.Items {
				m.document(at.within(i), item.Raw, nil, docKey{})
			}
		}
	default:
		kind, ns, name := identify(data)
		err := fmt.Errorf("apiVersion %q kind %q is not a Service or EndpointSlice; skipped", gvk.GroupVersion(), gvk.Kind)
		if gvk.Group == "" && gvk.Kind == "Endpoints" { // deprecated since 1.33
			err = fmt.Errorf("%w (write a discovery.k8s.io/v1 EndpointSlice instead: the proxy reads those, as kube-proxy does)", err)
		}
		m.warnings = append(m.warnings, m.problem(at, kind, objectRef{ns, name}, "", err))
	}
}

// noNesting refuses a List inside a List, which kubectl does not take
// either.
func (m *manifest) noNesting(at origin, kind string) bool {
	if at.item < 0 {
		return true
	}
	m.errs = append(m.errs, m.problem(at, kind, objectRef{}, "", errors.New("a List may not hold another list")))
	return false
}

// decodeError reports a document the decoder refused. Unknown kinds are
// warnings; strict decoding errors become one error per field.
func (m *manifest) decodeError(at origin, data []byte, obj runtime.Object, err error) {
	kind, ns, name := identify(data)
	problem := func(field string, err error) *ObjectError {
		return m.problem(at, kind, objectRef{ns, name}, field, err)
	}
	switch {
	case runtime.IsNotRegisteredError(err):
		apiVersion, _ := apiVersionKind(data)
		if !readsGroup(apiVersion) {
			// Another API group's kind, whatever its name (Knative's
			// Service, KubeEdge's Device): not a misspelling.
			m.warnings = append(m.warnings, problem("", fmt.Errorf("apiVersion %q kind %q is not a Service or EndpointSlice; skipped", apiVersion, kind)))
			return
		}
		if want, ok := kindVersions[kind]; ok {
			// A kind the proxy reads, at a version it does not: skipping
			// it would drop the object, as a misspelt kind would.
			m.errs = append(m.errs, problem("apiVersion", fmt.Errorf("%q is not a version of %s this proxy reads: want %s (kubectl refuses it too)", apiVersion, kind, want)))
			return
		}
		if want := nearKind(kind); want != "" {
			// A misspelt kind would silently drop the object: refuse
			// the edit instead, so the last good state keeps serving.
			m.errs = append(m.errs, problem("kind", fmt.Errorf("%q is not a kind; did you mean %s?", kind, want)))
			return
		}
		m.warnings = append(m.warnings, problem("", fmt.Errorf("apiVersion %q kind %q is not a Service or EndpointSlice; skipped", apiVersion, kind)))
		return
	case runtime.IsMissingKind(err), runtime.IsMissingVersion(err):
		m.errs = append(m.errs, problem("", errors.New("apiVersion and kind are required")))
		return
	}
	if shape := notAnObject(data); shape != "" {
		m.errs = append(m.errs, problem("", fmt.Errorf("is %s, not an object with apiVersion and kind (several objects go one after another, or in a kind: List with items)", shape)))
		return
	}
	if field, line, reason, ok := locateTypeError(&m.lines, data, err.Error()); ok {
		// A value of the wrong type: name it with its list indexes and
		// line, which the decoder's message lacks.
		e := problem(field, errors.New(reason))
		if at.line > 0 && at.item < 0 {
			e.Line = at.line + line - 1
		}
		m.errs = append(m.errs, e)
		return
	}
	strict, ok := runtime.AsStrictDecodingError(err)
	// A message that names a line (YAML that does not parse, a duplicated
	// key) is about that line.
	lined := func(field, msg string) *ObjectError {
		msg, line := m.fileLines(msg, at)
		e := problem(field, errors.New(msg))
		if line > 0 {
			e.Line = line
		}
		return e
	}
	if !ok || obj == nil {
		e := lined("", err.Error())
		if strings.HasSuffix(err.Error(), "document contains excessive aliasing") && at.item < 0 && at.line > 0 {
			// The decoder names no line: name the alias it gave up in.
			if l := excessiveAliasLine(data); l > 0 {
				e.Line = at.line + l - 1
			}
		}
		m.errs = append(m.errs, e)
		return
	}
	for _, e := range strict.Errors() {
		m.errs = append(m.errs, lined(strictField(e.Error())))
	}
}

// notAnObject names what a document is when it is not a mapping: "a list",
// "a string" and so on; "" for a mapping, or a document that does not
// parse at all (its parse error says more).
func notAnObject(data []byte) string {
	j, err := utilyaml.ToJSON(data)
	if err != nil {
		return ""
	}
	var v any
	if stdjson.Unmarshal(j, &v) != nil {
		return ""
	}
	switch v.(type) {
	case map[string]any:
		return ""
	case []any:
		return "a list"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return "null"
	}
}

// strictField splits `unknown field "spec.prots"` into the field and the
// reason. Other messages are returned whole.
func strictField(msg string) (field, reason string) {
	for _, reason := range []string{"unknown field", "duplicate field"} {
		rest, ok := strings.CutPrefix(msg, reason+` "`)
		if f, ok2 := strings.CutSuffix(rest, `"`); ok && ok2 {
			return f, reason
		}
	}
	return "", msg
}

// identify reads kind, namespace and name from a document the decoder
// refused, or of a kind the proxy does not read, for messages only: it
// ignores any error. A document without a namespace is in "default", as
// kubectl puts it, unless its kind is a cluster-scoped one of Kubernetes
// (Namespace, ClusterRole): that has no namespace.
func identify(data []byte) (kind, namespace, name string) {
	var probe struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	_ = utilyaml.Unmarshal(data, &probe)
	if probe.Metadata.Name != "" && probe.Metadata.Namespace == "" && !clusterScoped[probe.Kind] {
		probe.Metadata.Namespace = corev1.NamespaceDefault
	}
	return probe.Kind, probe.Metadata.Namespace, probe.Metadata.Name
}

func apiVersionKind(data []byte) (apiVersion, kind string) {
	var probe struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	_ = utilyaml.Unmarshal(data, &probe)
	return probe.APIVersion, probe.Kind
}

// register records where an object was found, valid or not; a second
// object with the same kind, namespace and name is an error naming both
// places. Objects without a name are not registered (validation reports
// them).
func (m *manifest) register(at origin, kind string, ref objectRef) bool {
	if ref.name == "" {
		return true
	}
	key := objectKey{kind, ref}
	if first, dup := m.origins[key]; dup {
		m.errs = append(m.errs, m.problem(at, kind, ref, "", fmt.Errorf("duplicate of %s", first)))
		return false
	}
	m.origins[key] = at
	return true
}

// addService adds a Service found at at. svc is not changed: it may be
// kept for the next read (see docCache).
func (m *manifest) addService(at origin, svc *corev1.Service) {
	if svc.Namespace == "" {
		c := *svc
		c.Namespace = corev1.NamespaceDefault
		svc = &c
	}
	ok := m.check(at, "Service", svc.Namespace, svc.Name, validateService(svc))
	if m.register(at, "Service", objectRef{svc.Namespace, svc.Name}) && ok {
		m.services = append(m.services, svc)
	}
}

// addSlice adds an EndpointSlice found at at. s is not changed: it may be
// kept for the next read (see docCache).
func (m *manifest) addSlice(at origin, s *discoveryv1.EndpointSlice) {
	c := *s // to default
	s = &c
	if s.Namespace == "" {
		s.Namespace = corev1.NamespaceDefault
	}
	ok := m.check(at, "EndpointSlice", s.Namespace, s.Name, validateSlice(s))
	if m.register(at, "EndpointSlice", objectRef{s.Namespace, s.Name}) && ok && s.Labels[discoveryv1.LabelServiceName] != "" {
		defaultSlicePorts(s)
		m.slices = append(m.slices, s)
	}
}

// defaultSlicePorts sets what the API server defaults in a slice's ports: a
// port without a name is named "", one without a protocol is TCP. A slice
// read from a cluster always has both, and the shared semantics skip a port
// whose name is nil, as kube-proxy does; without these defaults the usual
// slice of a one-port Service, written without a port name, would serve
// nothing. The ports are copied first: s shares them with the slice as
// decoded.
func defaultSlicePorts(s *discoveryv1.EndpointSlice) {
	s.Ports = slices.Clone(s.Ports)
	for i := range s.Ports {
		p := &s.Ports[i]
		if p.Name == nil {
			p.Name = new("")
		}
		if p.Protocol == nil {
			p.Protocol = new(corev1.ProtocolTCP)
		}
	}
}

// check files the findings of a validation and reports whether the object
// is usable.
func (m *manifest) check(at origin, kind, ns, name string, fs []finding) bool {
	ok := true
	for _, f := range fs {
		e := m.problem(at, kind, objectRef{ns, name}, f.field, f.err)
		if f.warning {
			m.warnings = append(m.warnings, e)
		} else {
			m.errs = append(m.errs, e)
			ok = false
		}
	}
	return ok
}

// clusterScoped holds the cluster-scoped kinds of Kubernetes' own API
// groups (`kubectl api-resources --namespaced=false`, 1.36), for naming
// objects the proxy skips. A custom resource's scope is not known here:
// its kind is named as namespaced ones are.
var clusterScoped = map[string]bool{
	"APIService": true, "CSIDriver": true, "CSINode": true, "CertificateSigningRequest": true,
	"ClusterRole": true, "ClusterRoleBinding": true, "ClusterTrustBundle": true, "ComponentStatus": true,
	"CustomResourceDefinition": true, "DeviceClass": true, "FlowSchema": true, "IPAddress": true,
	"IngressClass": true, "MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true,
	"MutatingWebhookConfiguration": true, "Namespace": true, "Node": true, "PersistentVolume": true,
	"PriorityClass": true, "PriorityLevelConfiguration": true, "ResourceSlice": true, "RuntimeClass": true,
	"ServiceCIDR": true, "StorageClass": true, "StorageVersionMigration": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
	"ValidatingWebhookConfiguration": true, "VolumeAttachment": true, "VolumeAttributesClass": true,
}

// kindVersions maps the kinds the proxy reads to the apiVersion it reads
// them at.
var kindVersions = map[string]string{
	"Service": "v1", "ServiceList": "v1", "List": "v1",
	"EndpointSlice": "discovery.k8s.io/v1", "EndpointSliceList": "discovery.k8s.io/v1",
}

// readsGroup reports whether apiVersion is, or looks like a misspelling
// of, a version of an API group the proxy reads: the core group (no
// group: "v1") or discovery.k8s.io. Only there is a kind near Service or
// EndpointSlice, or one of them at another version, taken for a mistake
// that would drop the object.
func readsGroup(apiVersion string) bool {
	group, _, found := strings.Cut(apiVersion, "/")
	return !found || editDistance(strings.ToLower(group), "discovery.k8s.io") <= 2
}

// nearKind returns the kind the proxy reads that kind looks like a
// misspelling of (another case, or two letters off), or "".
func nearKind(kind string) string {
	for _, want := range []string{"Service", "EndpointSlice"} {
		if kind != want && editDistance(strings.ToLower(kind), strings.ToLower(want)) <= 2 {
			return want
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
