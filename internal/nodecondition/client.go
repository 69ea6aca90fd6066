package nodecondition

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// API is what the publisher asks of the API server.
type API interface {
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	// PatchNodeStatus applies a strategic merge patch to the Node's status subresource.
	PatchNodeStatus(ctx context.Context, name string, patch []byte) error
	GetService(ctx context.Context, namespace, name string) (*corev1.Service, error)
	CreateEvent(ctx context.Context, ev *corev1.Event) error
}

// restAPI is API on a core/v1 REST client whose scheme knows core/v1 only. The generated
// typed client (k8s.io/client-go/kubernetes/typed/core/v1) would do the same requests, but
// importing it links client-go's scheme of every API group: the exporter's stripped binary
// grows from 24 MB to 41 MB for four requests.
type restAPI struct {
	c      rest.Interface
	params runtime.ParameterCodec
}

// NewAPI returns the API for cfg (the exporter's own connection settings).
func NewAPI(cfg *rest.Config) (API, error) {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := corev1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering core/v1: %w", err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the core/v1 client for %s: %w", cfg.Host, err)
	}
	return &restAPI{c: rc, params: runtime.NewParameterCodec(s)}, nil
}

func (a *restAPI) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := a.c.Get().Resource("nodes").Name(name).Do(ctx).Into(n)
	return n, err
}

func (a *restAPI) PatchNodeStatus(ctx context.Context, name string, patch []byte) error {
	return a.c.Patch(types.StrategicMergePatchType).Resource("nodes").Name(name).SubResource("status").Body(patch).Do(ctx).Error()
}

func (a *restAPI) GetService(ctx context.Context, namespace, name string) (*corev1.Service, error) {
	s := &corev1.Service{}
	err := a.c.Get().Namespace(namespace).Resource("services").Name(name).Do(ctx).Into(s)
	return s, err
}

func (a *restAPI) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	return a.c.Post().Namespace(ev.Namespace).Resource("events").VersionedParams(&metav1.CreateOptions{}, a.params).Body(ev).Do(ctx).Error()
}
