"""Parts of the example GRPO loop (``examples/grpo_loop.py``): the toy task and its reward, the
samplers that talk to a Sparrow server or a router, the policy-gradient objective with truncated
importance sampling, and the weight / schedule / adapter synchronisation with the fleet."""
