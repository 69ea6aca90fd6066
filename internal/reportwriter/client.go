package reportwriter

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// API is what the writer asks of the API server.
type API interface {
	// GetNode reads the Node, for its UID: the report's owner.
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	UpdateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error
	CreateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error
}

// restAPI is API on a core/v1 REST client whose scheme knows core/v1 only, as
// internal/nodecondition's: the generated typed client would link every API group.
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

func (a *restAPI) UpdateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	return a.c.Put().Namespace(cm.Namespace).Resource("configmaps").Name(cm.Name).
		VersionedParams(&metav1.UpdateOptions{}, a.params).Body(cm).Do(ctx).Error()
}

func (a *restAPI) CreateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	return a.c.Post().Namespace(cm.Namespace).Resource("configmaps").
		VersionedParams(&metav1.CreateOptions{}, a.params).Body(cm).Do(ctx).Error()
}
