package source

import (
	"bufio"
	"bytes"
	"io"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// yamlReaderChunks is what utilyaml.YAMLReader reads from data: its chunks
// and the error it ends with.
func yamlReaderChunks(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var chunks [][]byte
	for {
		c, err := r.Read()
		if err != nil {
			return chunks, err
		}
		chunks = append(chunks, c)
	}
}

// documentsChunks is the same of documents.
func documentsChunks(data []byte) ([][]byte, error) {
	r := &documents{data: data}
	var chunks [][]byte
	for {
		c, err := r.next()
		if err != nil {
			return chunks, err
		}
		chunks = append(chunks, c)
	}
}

// checkSameChunks fails unless documents splits data as YAMLReader does.
func checkSameChunks(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := yamlReaderChunks(data)
	got, err := documentsChunks(data)
	if len(got) != len(want) || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
		t.Fatalf("%q: chunks %q, %v; YAMLReader's %q, %v", data, got, err, want, wantErr)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%q: chunk %d is %q; YAMLReader's %q", data, i, got[i], want[i])
		}
	}
}

// seedChunks are files whose splitting has edges: separators first, in a
// row, with comments and spaces after them or other text, CRLF and lone CR
// line ends, no final newline, lines longer than bufio's buffer.
var seedChunks = []string{
	"", "\n", "a: 1", "a: 1\n", "a: 1\r\n", "a: 1\r", "a: 1\r\r\n", "\r\n\r\n",
	"---", "---\n", "---\r\n", "--- \n", "---\t# c\n", "--- # c\r\na: 1\n", "---x\n", "a: 1\n---x\n", "a: 1\n--- x\n",
	"a: 1\n---\nb: 2\n", "a: 1\r\n---\r\nb: 2", "---\n---\na: 1\n---\n---\n", "a: 1\n---\n", "a: 1\n---",
	"a: 1\n----\n", "a: 1\n --- \n", "# c\n---\n# d\n", "a: |\n  ---\n", "\u00a0---\n", "---\u00a0\n", "---\u2028x\n",
	"a: " + string(bytes.Repeat([]byte("x"), 5000)) + "\r\n---\nb: 1\n",
	string(bytes.Repeat([]byte("y"), 4095)) + "\r\n" + string(bytes.Repeat([]byte("z"), 4097)) + "\r\n",
}

// TestDocumentsSplitAsYAMLReader: documents, which slices the file where
// YAMLReader copied each chunk, returns the same chunks and errors.
func TestDocumentsSplitAsYAMLReader(t *testing.T) {
	for _, s := range seedChunks {
		checkSameChunks(t, []byte(s))
	}
	checkSameChunks(t, generatedManifest(50, 3))
}

// TestDocumentsShareTheFile: a chunk that is the file's own bytes is a
// slice of the file, not a copy, and the capacity of a slice ends with
// it.
func TestDocumentsShareTheFile(t *testing.T) {
	data := []byte("a: 1\n---\nb: 2\r\n---\nc: 3\n")
	r := &documents{data: data}
	for i, want := range []struct {
		text   string
		shared bool
	}{{"a: 1\n", true}, {"b: 2\n", false}, {"c: 3\n", true}} {
		c, err := r.next()
		if err != nil || string(c) != want.text {
			t.Fatalf("chunk %d: %q, %v; want %q", i, c, err, want.text)
		}
		if shared := &c[0] == &data[bytes.Index(data, []byte(want.text[:4]))]; shared != want.shared {
			t.Errorf("chunk %d %q shares the file: %v; want %v", i, c, shared, want.shared)
		}
		if want.shared && cap(c) != len(c) {
			t.Errorf("chunk %d has capacity %d past its length %d", i, cap(c), len(c))
		}
	}
	if _, err := r.next(); err != io.EOF {
		t.Errorf("after the last chunk: %v; want io.EOF", err)
	}
}

// FuzzDocuments: documents splits any file as YAMLReader does.
func FuzzDocuments(f *testing.F) {
	for _, s := range seedChunks {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSameChunks(t, data)
	})
}
