package iptlegacy

import (
	"os"
	"reflect"
	"testing"
)

// DecodeRecordedFilter is ReadFilter's decoder on a recorded table, and refuses one whose
// entries are not the size its info says.
func TestDecodeRecordedFilter(t *testing.T) {
	for _, path := range []string{"testdata/kube-proxy.filter.blob", "testdata/node-legacy-empty.filter.blob"} {
		info, entries := loadBlob(t, path, false)
		want, err := decodeFilter(info, entries)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRecordedFilter(b, false)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded\n%+v\nwant\n%+v", path, got, want)
		}
		if _, err := DecodeRecordedFilter(b[:len(b)-1], false); err == nil {
			t.Errorf("%s: a recording one byte short decoded", path)
		}
	}
}
