package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// How the view lists. client-go v0.36 reflectors stream the initial list by default (the
// WatchListClient feature, beta and on since v1.35): a watch with sendInitialEvents=true
// delivers every object as an event, then a bookmark; kube-apiserver serves it since v1.34
// (its WatchList feature). The reflector keeps the streamed objects in a temporary store,
// applying the store's Transformer to each as it arrives, so with kindStore's the stream never
// holds more than one API object at a time.
//
// A server without streaming makes the reflector fall back to a plain list, which client-go's
// pager would collect whole (every page's API objects in one list) before handing it over; and
// its first list asks for resourceVersion "0", which the watch cache serves in one piece
// whatever the limit. pagedList instead asks for the most recent version (served from the
// watch cache or etcd, in pages of listPageSize), converting each page before fetching the
// next. An API server on Debian's etcd 3.4.23 is such a server: consistent reads from the
// watch cache, which a streamed list is, need etcd 3.4.31 or 3.5.13 and later.

// The label selectors kube-proxy v1.36 lists with (cmd/kube-proxy/app/server.go): Services
// claimed by another proxy (service.kubernetes.io/service-proxy-name) and the EndpointSlices
// of headless Services (service.kubernetes.io/headless) never reach its proxiers.
const labelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// listPageSize is the objects per page of a paged list. A page's API objects are decoded
// whole before any is converted, so the page bounds the list's peak on top of the view: 100
// EndpointSlices of 10 endpoints are about 0.3 MB of protobuf and a few MB decoded, where
// client-go's 500 made a visible step in the peak. At 10,000 objects the 100 round trips cost
// well under a second on a nearby API server; the pages after the first wait on no
// client-side rate limit (restResource).
const listPageSize = 100

func selectorWithout(label string) string {
	req, err := labels.NewRequirement(label, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant label: cannot fail
	}
	return labels.NewSelector().Add(*req).String()
}

// listOptions are each kind's selectors.
func listOptions(k kind, nodeName string) func(*metav1.ListOptions) {
	switch k {
	case kindService:
		noProxyName := selectorWithout(labelServiceProxyName)
		// kube-proxy also leaves out clusterIP None with a field selector; the store drops
		// those too, the selector only saves their transfer.
		noHeadless := fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
		return func(o *metav1.ListOptions) { o.LabelSelector, o.FieldSelector = noProxyName, noHeadless }
	case kindSlice:
		noHeadless := selectorWithout(corev1.IsHeadlessService)
		return func(o *metav1.ListOptions) { o.LabelSelector = noHeadless }
	default:
		byName := fields.OneTermEqualSelector("metadata.name", nodeName).String()
		return func(o *metav1.ListOptions) { o.FieldSelector = byName }
	}
}

// newListWatch lists and watches kind k through rc; convert turns the objects of a paged
// list into their compact form (the store's Transformer). A streamed list's watch lowers the
// collector's target through gc (nil: never), until the list is stored (streamedListStore)
// or the watch stops.
func newListWatch(rc resourceClient, k kind, nodeName string, noWatchList bool, convert cache.TransformFunc, gc *streamGC) cache.ListerWatcher {
	tweak := listOptions(k, nodeName)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return pagedList(ctx, rc, convert, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			if gc == nil || opts.SendInitialEvents == nil || !*opts.SendInitialEvents {
				return rc.watch(ctx, opts)
			}
			gc.started()
			w, err := rc.watch(ctx, opts)
			if err != nil {
				gc.ended() // refused (a server without streaming): the reflector lists instead
				return nil, err
			}
			return stopEndsGC{w, gc}, nil
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, watchListSupport(!noWatchList))
}

// watchListSupport tells the reflector whether the client can stream lists
// (client-go's util/watchlist.DoesClientNotSupportWatchListSemantics).
type watchListSupport bool

func (s watchListSupport) IsWatchListSemanticsUnSupported() bool { return !bool(s) }

// pagedList lists in pages of listPageSize at the most recent resource version and returns
// the objects in compact form, with the garbage collector's target lowered meanwhile
// (lowerGCForList). Continuing a list whose version has been compacted away fails
// with "expired"; the reflector then lists again from the start.
func pagedList(ctx context.Context, rc resourceClient, convert cache.TransformFunc, opts metav1.ListOptions) (runtime.Object, error) {
	opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	opts.Limit, opts.Continue = listPageSize, ""
	defer lowerGCForList()()
	out := &compactList{}
	for {
		page, err := rc.list(ctx, opts)
		if err != nil {
			return nil, err
		}
		err = meta.EachListItem(page, func(obj runtime.Object) error {
			c, err := convert(obj)
			if err != nil {
				return err
			}
			out.Items = append(out.Items, c.(runtime.Object))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading a list page: %w", err)
		}
		lm, err := meta.ListAccessor(page)
		if err != nil {
			return nil, fmt.Errorf("reading a list page's metadata: %w", err)
		}
		out.ResourceVersion = lm.GetResourceVersion()
		if lm.GetContinue() == "" {
			return out, nil
		}
		opts.Continue = lm.GetContinue()
	}
}

// compactList is a list of compact objects, in the shape the reflector reads a list in
// (meta.ListAccessor for its version, an Items slice of runtime.Objects).
type compactList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object
}

// DeepCopyObject returns the list itself: nothing modifies a compact list or its items.
func (l *compactList) DeepCopyObject() runtime.Object { return l }
