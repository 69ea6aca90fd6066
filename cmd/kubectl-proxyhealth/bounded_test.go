package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/proxyhealth/proxyhealth/internal/verdict"
)

// Each exporter's answer is read up to --max-status-bytes and no further: a larger one leaves
// its node unknown with the reason, and one of exactly the limit is read.
func TestStatusReadBounded(t *testing.T) {
	a := newAuthAPIServer(t, true)
	var size int
	a.set(func(a *authAPIServer) {
		a.exportersOpen = true
		// A healthy /status padded with JSON whitespace to size bytes.
		a.answer = func(node string) []byte {
			b := statusBody(t, node, verdict.Healthy)
			return append(b, bytes.Repeat([]byte(" "), size-len(b))...)
		}
	})

	size = defaultMaxStatusBytes + 1
	out, errOut, code := a.run(t)
	want := "error: GET /status through the pod proxy: the answer is larger than 4194304 bytes (--max-status-bytes); not read further"
	if code != exitCannotRun || strings.Count(out, want) != 2 {
		t.Errorf("answers of 4 MiB + 1: exit %d, want 3 with both nodes saying %q:\n%s%s", code, want, out, errOut)
	}
	if errOut != "" {
		t.Errorf("stderr: %q, want nothing (the reason is the node's)", errOut)
	}

	size = 64 << 10
	out, errOut, code = a.run(t, "--max-status-bytes="+strconv.Itoa(size))
	if code != exitHealthy || strings.Count(out, "healthy  -") != 2 {
		t.Errorf("answers of exactly --max-status-bytes: exit %d, want 0 with both nodes healthy:\n%s%s", code, out, errOut)
	}
	out, errOut, code = a.run(t, "--max-status-bytes="+strconv.Itoa(size-1))
	if code != exitCannotRun || !strings.Contains(out, "larger than 65535 bytes") {
		t.Errorf("answers of --max-status-bytes + 1: exit %d, want 3 naming the limit:\n%s%s", code, out, errOut)
	}
}

func TestMaxStatusBytesFlag(t *testing.T) {
	for _, v := range []string{"0", "-1", "lots"} {
		if _, err := parseFlags([]string{"--max-status-bytes=" + v}, &bytes.Buffer{}); err == nil {
			t.Errorf("--max-status-bytes=%s accepted", v)
		}
	}
}
