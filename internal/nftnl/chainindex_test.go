package nftnl

import (
	"reflect"
	"testing"
)

func TestChainIndex(t *testing.T) {
	ix := chainIndex{}
	ix.add("endpoint-a", "service-1")
	ix.add("endpoint-a", "service-1") // once only
	ix.add("endpoint-a", "service-2")
	ix.add("endpoint-b", "service-2")
	want := chainIndex{"endpoint-a": {"service-1", "service-2"}, "endpoint-b": {"service-2"}}
	if !reflect.DeepEqual(ix, want) {
		t.Fatalf("after adds: %v, want %v", ix, want)
	}
	ix.remove("endpoint-a", "service-1")
	ix.remove("endpoint-a", "service-3") // not there: nothing changes
	ix.remove("endpoint-c", "service-1")
	ix.remove("endpoint-b", "service-2") // its last: the key goes
	want = chainIndex{"endpoint-a": {"service-2"}}
	if !reflect.DeepEqual(ix, want) {
		t.Fatalf("after removes: %v, want %v", ix, want)
	}
	ix.add("endpoint-a", "service-1")
	if got := ix["endpoint-a"]; !reflect.DeepEqual(got, []string{"service-2", "service-1"}) {
		t.Fatalf("added again: %v", got)
	}
}
