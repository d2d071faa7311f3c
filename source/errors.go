package source

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ErrEmptyManifest reports a manifest file with no content at all. An
// editor that truncates a file before writing it leaves it empty for a
// moment, so an empty file is never taken to mean "serve nothing": write a
// comment or an empty List for that.
var ErrEmptyManifest = errors.New("manifest file is empty")

// ErrRefusedAddress reports an endpoint or frontend address the proxy will
// not use: unspecified, broadcast, multicast, link-local (which includes
// the cloud metadata address 169.254.169.254) or, unless allowed, loopback.
var ErrRefusedAddress = errors.New("address refused")

// ObjectError is a problem with one Kubernetes object, or with one field of
// it. BuildSnapshot reports skipped fields and refused endpoints with it;
// ParseManifests also fills in the file and document.
type ObjectError struct {
	// File and Document locate the object in a manifest file; Document
	// counts non-empty YAML documents from 1. Both are zero for objects that
	// came from the API server.
	File     string
	Document int
	// Line is the line of the file the problem is on: the field's, or the
	// one a YAML message names, when known, else the one where the document
	// starts; 0 outside a file. It is logged, not part of the message.
	Line int
	// Kind, Namespace and Name identify the object, when known.
	Kind      string
	Namespace string
	Name      string
	// Field is the path of the offending field, e.g. "spec.ports[0].port".
	// Empty when the problem concerns the whole object.
	Field string
	Err   error
}

// Error returns e.g. "demo.yaml: document 3 (Service demo/web):
// spec.ports[0].port: 70000 is out of range 1-65535", or, without a file,
// "Service demo/web: spec.ports[0].port: ...".
func (e *ObjectError) Error() string { return e.format(false) }

// format is Error, with the line after the file name ("demo.yaml:12:
// document 3 ...", as compilers name a line and editors take it) when
// withLine is true and the line is known.
func (e *ObjectError) format(withLine bool) string {
	var b strings.Builder
	obj := e.Object()
	if e.File != "" {
		b.WriteString(e.File)
		if withLine && e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		if e.Document > 0 {
			fmt.Fprintf(&b, ": document %d", e.Document)
		}
		if obj != "" {
			b.WriteString(" (" + obj + ")")
		}
		b.WriteString(": ")
	} else if obj != "" {
		b.WriteString(obj + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("invalid")
	}
	return b.String()
}

func (e *ObjectError) Unwrap() error { return e.Err }

// linedError is an ObjectError whose message names its line, for where no
// log line gives it as the "line" key: the error that stops the proxy at
// start-up.
type linedError struct{ e *ObjectError }

func (l linedError) Error() string { return l.e.format(true) }
func (l linedError) Unwrap() error { return l.e }

// withLines returns err, the errors of a manifest file joined, with each
// ObjectError's message naming its line.
func withLines(err error) error {
	errs := flatten(err)
	for i, e := range errs {
		if oe, ok := e.(*ObjectError); ok && oe.File != "" && oe.Line > 0 {
			errs[i] = linedError{oe}
		}
	}
	return errors.Join(errs...)
}

// lined returns errs, with each ObjectError's message naming its line, in
// a new slice (errs may be kept by others).
func lined(errs []error) []error {
	if len(errs) == 0 {
		return errs
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = withLines(e)
	}
	return out
}

// Object returns "Kind namespace/name" with whatever parts are known, or "".
func (e *ObjectError) Object() string {
	id := e.Name
	if e.Namespace != "" && e.Name != "" {
		id = e.Namespace + "/" + e.Name
	}
	switch {
	case e.Kind != "" && id != "":
		return e.Kind + " " + id
	case e.Kind != "":
		return e.Kind
	}
	return id
}

// logValues returns the structured log keys describing err: file, document,
// object and field when err is (or wraps) an ObjectError.
func logValues(err error) []any {
	var oe *ObjectError
	if !errors.As(err, &oe) {
		return nil
	}
	var kv []any
	if oe.File != "" {
		kv = append(kv, "file", oe.File)
	}
	if oe.Document > 0 {
		kv = append(kv, "document", oe.Document)
	}
	if oe.Line > 0 {
		kv = append(kv, "line", oe.Line)
	}
	if obj := oe.Object(); obj != "" {
		kv = append(kv, "object", obj)
	}
	if oe.Field != "" {
		kv = append(kv, "field", oe.Field)
	}
	return kv
}

// flatten lists the errors joined in err (by errors.Join), or err alone.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// inFileOrder sorts the problems of a manifest file in the order of the
// file: by document, then item of a List, then line; the checks across
// objects find theirs after every document is read. Problems that name no
// document go last. The sort is stable.
func inFileOrder(errs []error) {
	slices.SortStableFunc(errs, func(a, b error) int {
		ka, kb := fileOrder(a), fileOrder(b)
		return cmp.Or(cmp.Compare(ka[0], kb[0]), cmp.Compare(ka[1], kb[1]), cmp.Compare(ka[2], kb[2]))
	})
}

// fileOrder is err's place in its file: document, item (-1 for none) and
// line.
func fileOrder(err error) [3]int {
	var oe *ObjectError
	if !errors.As(err, &oe) || oe.Document <= 0 {
		return [3]int{math.MaxInt, -1, 0}
	}
	item := -1
	if rest, ok := strings.CutPrefix(oe.Field, "items["); ok {
		if n, _, ok := strings.Cut(rest, "]"); ok {
			if i, err := strconv.Atoi(n); err == nil {
				item = i
			}
		}
	}
	return [3]int{oe.Document, item, oe.Line}
}
