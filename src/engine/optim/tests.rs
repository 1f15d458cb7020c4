//! The optimizers' tests: an update that fails part-way, and offloaded
//! moments against moments in memory.

/// An update that fails part-way leaves every parameter and every bit of
/// optimizer state as it was (the step can be retried): the second
/// parameter's gradient has the wrong shape, so its update fails after the
/// first parameter's was computed.
mod atomic {
    use candle_core::{Device, Tensor, Var};

    use super::super::*;

    fn vars_and_bad_grads() -> (Vec<(String, Var)>, GradStore) {
        let dev = Device::Cpu;
        let a = Var::new(&[1f32, 2.0], &dev).unwrap();
        let b = Var::new(&[3f32, 4.0, 5.0], &dev).unwrap();
        let mut grads = GradStore::default();
        grads.insert(a.as_tensor(), Tensor::new(&[0.5f32, -0.5], &dev).unwrap());
        grads.insert(b.as_tensor(), Tensor::new(&[0.5f32, -0.5], &dev).unwrap());
        (vec![("a".into(), a), ("b".into(), b)], grads)
    }

    fn values(vars: &[(String, Var)]) -> Vec<Vec<f32>> {
        vars.iter()
            .map(|(_, v)| v.as_tensor().to_vec1().unwrap())
            .collect()
    }

    fn state(o: &dyn Optimizer) -> Vec<(String, Vec<f32>)> {
        let mut s: Vec<_> = o
            .state()
            .into_iter()
            .map(|(k, t)| {
                let t = t
                    .flatten_all()
                    .unwrap()
                    .to_dtype(candle_core::DType::F32)
                    .unwrap();
                (k, t.to_vec1().unwrap())
            })
            .collect();
        s.sort_by(|a, b| a.0.cmp(&b.0));
        s
    }

    #[test]
    fn a_failed_update_changes_no_parameter_and_no_state() {
        let composed_adamw = AdamW::new(AdamWConfig::default()).with_fused(false);
        let sgd = Sgd::new(SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        });
        let optims: Vec<Box<dyn Optimizer>> = vec![Box::new(composed_adamw), Box::new(sgd)];
        for mut o in optims {
            let (vars, grads) = vars_and_bad_grads();
            o.prepare(&vars, &grads).unwrap();
            let (before, state_before) = (values(&vars), state(&*o));
            assert!(o.step(&vars, &grads).is_err(), "{}", o.kind());
            assert_eq!(values(&vars), before, "{}", o.kind());
            assert_eq!(state(&*o), state_before, "{}", o.kind());
        }
    }
}

/// Offloaded AdamW moments give the same weights and state as moments in
/// memory, bitwise (the same fused kernel runs on the mapped file), whether
/// offloaded from the start or moved there, and back, between steps.
mod offload {
    use candle_core::{Device, Tensor, Var};

    use super::super::*;

    /// Weights, optimizer state by name, and state bytes in memory.
    type Trained = (Vec<f32>, Vec<(String, Vec<f32>)>, usize);

    fn train(switch: &[(usize, bool)]) -> Trained {
        let dir = tempfile::tempdir().unwrap();
        let dev = Device::Cpu;
        let w = Var::new(&[0.5f32, -1.0, 2.0, 0.25, -0.75], &dev).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        let mut o = AdamW::new(AdamWConfig {
            lr: 0.1,
            ..AdamWConfig::default()
        });
        for step in 0..6 {
            for &(at, on) in switch {
                if at == step {
                    let place = offload::Place::Dir(dir.path().to_path_buf());
                    assert!(o.set_offload(on.then_some(place)).unwrap());
                }
            }
            let g = (w.as_tensor().sqr().unwrap() - 0.3).unwrap();
            let mut grads = GradStore::default();
            grads.insert(
                w.as_tensor(),
                Tensor::new(g.to_vec1::<f32>().unwrap().as_slice(), &dev).unwrap(),
            );
            o.prepare(&vars, &grads).unwrap();
            o.step(&vars, &grads).unwrap();
        }
        let mut state: Vec<_> = o
            .state()
            .into_iter()
            .map(|(k, t)| {
                (
                    k,
                    t.flatten_all()
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_vec1()
                        .unwrap(),
                )
            })
            .collect();
        state.sort_by(|a, b| a.0.cmp(&b.0));
        // Nothing is left in the folder: the files were removed once mapped.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        (
            w.as_tensor().to_vec1().unwrap(),
            state,
            o.state_bytes(&vars),
        )
    }

    #[test]
    fn offloaded_moments_train_bitwise_like_moments_in_memory() {
        let (w, state, bytes) = train(&[]);
        assert_eq!(bytes, 5 * 8);
        let (w1, state1, bytes1) = train(&[(0, true)]);
        assert_eq!((w1, state1), (w.clone(), state.clone()));
        assert_eq!(bytes1, 0, "offloaded moments take no memory");
        let (w2, state2, _) = train(&[(2, true), (4, false)]);
        assert_eq!((w2, state2), (w, state));
    }
}
