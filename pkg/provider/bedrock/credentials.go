package bedrock

import (
	"context"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
)

// credentialSource hands out the credentials that sign a key's calls:
// Config.Credentials for every key when set, else the default credential
// chain of the key's profile, loaded on its first call and kept.
type credentialSource struct {
	fixed *aws.CredentialsCache // Config.Credentials, cached; nil: per profile

	mu        sync.Mutex
	byProfile map[string]*aws.CredentialsCache // guarded by mu
}

func newCredentialSource(p aws.CredentialsProvider) *credentialSource {
	s := &credentialSource{byProfile: map[string]*aws.CredentialsCache{}}
	if p != nil {
		s.fixed = asCache(p)
	}
	return s
}

// asCache returns p as a credentials cache, wrapping it unless it is one.
func asCache(p aws.CredentialsProvider) *aws.CredentialsCache {
	if c, ok := p.(*aws.CredentialsCache); ok {
		return c
	}
	return aws.NewCredentialsCache(p)
}

// provider returns the credentials cache of profile ("" is the default
// chain's own choice: AWS_PROFILE, else "default"). The chain is loaded
// once per profile by config.LoadDefaultConfig, which reads the
// environment and the shared files but calls no service; region is only
// the fallback region of a profile that names none, which a role to
// assume needs for STS. A chain that fails to load is not kept: the next
// call tries again, so a fixed file takes effect without a restart.
func (s *credentialSource) provider(ctx context.Context, profile, region string) (*aws.CredentialsCache, error) {
	if s.fixed != nil {
		return s.fixed, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byProfile[profile]; c != nil {
		return c, nil
	}
	opts := []func(*config.LoadOptions) error{config.WithDefaultRegion(region)}
	if profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("load the default credential chain for profile %q: %w", profile, err)
	}
	if cfg.Credentials == nil {
		return nil, fmt.Errorf("profile %q: the default credential chain found no credentials", profile)
	}
	c := asCache(cfg.Credentials)
	s.byProfile[profile] = c
	return c, nil
}
