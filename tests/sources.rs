//! File sources: they read real formats, and corrupt or truncated files give
//! an error naming the file and the offset or line; nothing panics.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use std::sync::Arc;

use taper::data::{
    csv, idx, samples, text, tokens, Column, CsvOptions, Missing, Pipeline, Source, Stats, Targets,
    TokenType,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// An IDX file of unsigned bytes with the given dimensions.
fn idx_bytes(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn err_text<T>(r: taper::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn idx_reads_raw_and_gzipped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pixels: Vec<u8> = (0..3 * 2 * 2).map(|i| (i * 20) as u8).collect();
    let images = write(dir.path(), "img.gz", &gz(&idx_bytes(&[3, 2, 2], &pixels)));
    let labels = write(dir.path(), "lab", &idx_bytes(&[3], &[7, 1, 9]));
    let src = idx(&images, &labels, "train", 255.0)?;
    assert_eq!((src.len(), src.sample_len()), (3, 4));
    let (x, y) = src.gather(&[2, 0])?;
    assert_eq!(y.to_vec1::<u32>()?, vec![9, 7]);
    let x = x.to_vec2::<f32>()?;
    assert!((x[0][0] - 160.0 / 255.0).abs() < 1e-6 && x[1][3] == 60.0 / 255.0);
    Ok(())
}

#[test]
fn corrupt_idx_names_file_and_offset() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let labels = write(dir.path(), "lab", &idx_bytes(&[2], &[1, 2]));
    let truncated = write(dir.path(), "trunc", &idx_bytes(&[2, 2, 2], &[0; 5]));
    let msg = err_text(idx(&truncated, &labels, "x", 255.0));
    assert!(msg.contains("trunc: offset 16: dimensions [2, 2, 2] need 8 bytes of data, the file has 5 (truncated)"), "{msg}");
    let bad_magic = write(dir.path(), "magic", b"\x01\x02\x08\x01\x00\x00\x00\x02ab");
    let msg = err_text(idx(&bad_magic, &labels, "x", 255.0));
    assert!(msg.contains("magic: offset 0: not an IDX file"), "{msg}");
    let floats = write(
        dir.path(),
        "floats",
        &[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0],
    );
    let msg = err_text(idx(&floats, &labels, "x", 255.0));
    assert!(
        msg.contains("offset 2: element type 0x0d is not supported"),
        "{msg}"
    );
    let short = write(dir.path(), "short", &[0, 0]);
    assert!(err_text(idx(&short, &labels, "x", 255.0))
        .contains("short: offset 0: truncated IDX header"));
    let mut broken_gz = gz(&idx_bytes(&[2, 2, 2], &[0; 8]));
    broken_gz.truncate(broken_gz.len() / 2);
    let broken = write(dir.path(), "broken.gz", &broken_gz);
    assert!(err_text(idx(&broken, &labels, "x", 255.0)).contains("broken.gz: corrupt gzip stream"));
    let images = write(dir.path(), "img", &idx_bytes(&[3, 1, 1], &[0; 3]));
    let msg = err_text(idx(&images, &labels, "x", 255.0));
    assert!(
        msg.contains("[2] labels do not match the images' dimensions [3, 1, 1]"),
        "{msg}"
    );
    Ok(())
}

/// CSV options: the label column by index, whether the first row is a
/// header, and the divisor of the features.
fn by_index(label: i64, header: bool, scale: f32) -> CsvOptions {
    CsvOptions {
        label: Column::Index(label),
        header: Some(header),
        scale,
        ..CsvOptions::default()
    }
}

#[test]
fn csv_reads_and_reports_lines() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ok = write(dir.path(), "ok.csv", b"a,b,label\n1,2,0\n3,4,2\n");
    let src = csv(&ok, &by_index(-1, true, 2.0))?;
    let (x, y) = src.gather(&[1])?;
    assert_eq!(
        (x.to_vec2::<f32>()?, y.to_vec1::<u32>()?),
        (vec![vec![1.5, 2.0]], vec![2])
    );
    assert_eq!(src.classes(), None);
    let first = csv(&ok, &by_index(0, true, 1.0))?;
    assert_eq!(first.gather(&[1])?.1.to_vec1::<u32>()?, vec![3]);
    // Its header read as data (no column named, `header` not given): said
    // so, naming the label column to give; `header = false` keeps the
    // plain error.
    let msg = err_text(csv(&ok, &CsvOptions::default()));
    assert!(
        msg.contains("ok.csv: line 1 looks like column names (`a`, `b`, `label`), read as data: give `header = true`, or name the label column (`label = \"label\"`)"),
        "{msg}"
    );
    let msg = err_text(csv(&ok, &by_index(-1, false, 1.0)));
    assert!(
        msg.contains("line 1, column 1: `a` is not a number"),
        "{msg}"
    );
    // A spreadsheet's `;`-separated file read with `,`: one column.
    let semi = write(dir.path(), "semi.csv", b"1;2,5;0\n3;4,5;1\n");
    let msg = err_text(csv(&semi, &CsvOptions::default()));
    assert!(
        msg.contains("semi.csv: line 1, `1;2,5;0`, looks ';'-separated: give `delimiter = ';'`"),
        "{msg}"
    );

    let plain = CsvOptions::default();
    let ragged = write(dir.path(), "ragged.csv", b"1,2,0\n3,0\n");
    assert!(err_text(csv(&ragged, &plain)).contains("ragged.csv: line 2: 2 columns, expected 3"));
    let word = write(dir.path(), "word.csv", b"1,2,0\n3,x4,1\n");
    assert!(
        err_text(csv(&word, &plain)).contains("word.csv: line 2, column 2: `x4` is not a number")
    );
    for (cell, file) in [("inf", "inf.csv"), ("1e39", "big.csv")] {
        let path = write(dir.path(), file, format!("1,2,0\n3,{cell},1\n").as_bytes());
        let msg = err_text(csv(&path, &plain));
        let says = format!("{file}: line 2, column 2: `{cell}` is not a finite number");
        assert!(msg.contains(&says), "{msg}");
    }
    for (cell, file) in [("NaN", "nan.csv"), ("NA", "na.csv"), ("", "empty.csv")] {
        let path = write(dir.path(), file, format!("1,2,0\n3,{cell},1\n").as_bytes());
        let msg = err_text(csv(&path, &plain));
        let says = format!("{file}: line 2, column 2: a missing value (`{cell}`); `missing = \"drop\"` leaves such rows out");
        assert!(msg.contains(&says), "{msg}");
    }
    let frac = write(dir.path(), "frac.csv", b"1,2,0.5\n");
    assert!(err_text(csv(&frac, &plain))
        .contains("frac.csv: line 1, column 3: label `0.5` is not a class index: labels are classes (to predict a number, give the column as `target` instead of `label`)"));
    // As a target, the same cell is the number to predict: y is [n, 1] f32.
    let target = CsvOptions {
        targets: vec![Column::Index(-1)],
        ..plain.clone()
    };
    let (_, y) = csv(&frac, &target)?.gather(&[0])?;
    assert_eq!(y.to_vec2::<f32>()?, [[0.5]]);
    // Several targets: y is [n, k], the columns in the order given; the
    // features are the other columns.
    let rows = write(
        dir.path(),
        "rows.csv",
        b"1,2,0.5,7
3,4,-1.5,8
5,6,2.5,x
",
    );
    let two = CsvOptions {
        targets: vec![Column::Index(2), Column::Index(0)],
        ..plain.clone()
    };
    let msg = err_text(csv(&rows, &two));
    assert!(
        msg.contains("rows.csv: line 3, column 4: `x` is not a number"),
        "{msg}"
    );
    let rows = write(
        dir.path(),
        "rows.csv",
        b"1,2,0.5,7
3,4,-1.5,8
5,6,2.5,9
",
    );
    let table = csv(&rows, &two)?;
    assert_eq!(table.width(), 2);
    let (x, y) = table.gather(&[2, 0])?;
    assert_eq!(y.to_vec2::<f32>()?, [[2.5, 5.0], [0.5, 1.0]]);
    assert_eq!(x.to_vec2::<f32>()?, [[6.0, 9.0], [2.0, 7.0]]);
    assert!(
        table.describe().contains("targets column 3, column 1"),
        "{}",
        table.describe()
    );
    let cell = write(
        dir.path(),
        "cell.csv",
        b"1,2,0.5
3,4,big
",
    );
    let msg = err_text(csv(&cell, &two));
    assert!(
        msg.contains("cell.csv: line 2, column 3: target `big` is not a finite number"),
        "{msg}"
    );
    let twice = CsvOptions {
        targets: vec![Column::Index(2), Column::Index(-2)],
        ..plain.clone()
    };
    assert!(err_text(csv(&rows, &twice)).contains("column 3 is among the targets twice"));
    let feature = CsvOptions {
        features: Some(vec![Column::Index(1), Column::Index(0)]),
        ..two.clone()
    };
    assert!(
        err_text(csv(&rows, &feature)).contains("column 1 is a target; it cannot be a feature too")
    );
    Ok(())
}

/// A CSV file as pandas or a spreadsheet writes it: a byte-order mark, a
/// header, CRLF line ends, quoted cells holding the delimiter, class names
/// for labels and missing values.
#[test]
fn csv_reads_named_columns_class_names_and_missing_values() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let text = "\u{feff}name,species,\"mass, g\",wing,note\r\n\
                \"Smith, J\",heron,1.5,30,\"a \"\"quoted\"\" word\"\r\n\
                B,crane,NA,40,x\r\n\
                C,albatross,3.5,,x\r\n\
                D,crane,4.5,50,x\r\n";
    let path = write(dir.path(), "birds.csv", text.as_bytes());
    let named = |features: &[&str]| CsvOptions {
        label: Column::Name("species".into()),
        features: Some(
            features
                .iter()
                .map(|f| Column::Name(f.to_string()))
                .collect(),
        ),
        ..CsvOptions::default()
    };
    // Missing values stop reading, naming the line and the column.
    let msg = err_text(csv(&path, &named(&["wing", "mass, g"])));
    assert!(
        msg.contains("birds.csv: line 3, column 3 (`mass, g`): a missing value (`NA`)"),
        "{msg}"
    );
    // Or are left out, and counted by line.
    let src = csv(
        &path,
        &CsvOptions {
            missing: Missing::Drop,
            ..named(&["wing", "mass, g"])
        },
    )?;
    assert_eq!(lines(src.dropped()), [3, 4]);
    assert_eq!(src.len(), 2);
    let names = ["crane", "heron"].map(String::from);
    assert_eq!(src.classes(), Some(&names[..]), "sorted class names");
    let (x, y) = src.gather(&[0, 1])?;
    assert_eq!(x.to_vec2::<f32>()?, vec![vec![30.0, 1.5], vec![50.0, 4.5]]);
    assert_eq!(y.to_vec1::<u32>()?, vec![1, 0]);
    assert!(src
        .describe()
        .contains("2 rows with a missing value left out"));

    // Every other column by default: `name` is a word, and the message
    // says how to read categories and how to choose columns.
    let msg = err_text(csv(
        &path,
        &CsvOptions {
            label: Column::Name("species".into()),
            ..CsvOptions::default()
        },
    ));
    assert!(
        msg.contains("line 2, column 1 (`name`): `Smith, J` is not a number (a column of categories is one-hot encoded with `categorical = { \"name\" }`; choose the columns with `features = { ... }`)"),
        "{msg}"
    );
    let msg = err_text(csv(&path, &named(&["wings"])));
    assert!(
        msg.contains("feature column `wings` is not in the header, which names `name`, `species`, `mass, g`, `wing`, `note`"),
        "{msg}"
    );
    let msg = err_text(csv(&path, &named(&["wing", "species"])));
    assert!(msg.contains("column 2 (`species`) is the label"), "{msg}");
    let msg = err_text(csv(&path, &named(&["wing", "wing"])));
    assert!(
        msg.contains("column 4 (`wing`) is among the features twice"),
        "{msg}"
    );
    let msg = err_text(csv(
        &path,
        &CsvOptions {
            header: Some(false),
            ..named(&["wing"])
        },
    ));
    assert!(
        msg.contains("columns are named but `header` is false"),
        "{msg}"
    );

    // Given classes label by those names, in that order; a name outside them
    // is an error.
    let given = |classes: &[&str]| CsvOptions {
        classes: Some(classes.iter().map(|c| c.to_string()).collect()),
        missing: Missing::Drop,
        ..named(&["wing"])
    };
    let src = csv(&path, &given(&["heron", "crane", "stork"]))?;
    assert_eq!(src.gather(&[0, 1])?.1.to_vec1::<u32>()?, vec![0, 1]);
    assert_eq!(src.classes().map(|c| c.len()), Some(3));
    let msg = err_text(csv(&path, &given(&["heron"])));
    assert!(
        msg.contains(
            "line 3, column 2 (`species`): label `crane` is not one of the classes (`heron`)"
        ),
        "{msg}"
    );

    // Tab-separated, by the delimiter.
    let tsv = write(dir.path(), "t.tsv", b"a\tb\tlabel\n1\t2\tcat\n");
    let src = csv(
        &tsv,
        &CsvOptions {
            delimiter: b'\t',
            header: Some(true),
            ..CsvOptions::default()
        },
    )?;
    assert_eq!(src.gather(&[0])?.0.to_vec2::<f32>()?, vec![vec![1.0, 2.0]]);
    Ok(())
}

/// `standardize` shifts and scales each feature by the mean and population
/// deviation of the data it is given (computed here in f64), and data
/// standardized like another uses that data's statistics.
#[test]
fn standardize_uses_the_statistics_of_the_data_given() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let rows: Vec<[f64; 3]> = (0..50)
        .map(|i| {
            let i = i as f64;
            [1000.0 + 37.0 * (i * 0.7).sin(), 0.01 * i, 5.0]
        })
        .collect();
    let mut text = String::from("a,b,c,label\n");
    for (i, r) in rows.iter().enumerate() {
        text += &format!("{},{},{},{}\n", r[0] as f32, r[1] as f32, r[2], i % 3);
    }
    let path = write(dir.path(), "t.csv", text.as_bytes());
    let all = Pipeline::new(Arc::new(csv(&path, &by_index(-1, true, 1.0))?));
    let parts = all.split(&[0.8, 0.2], None)?;
    let (train, test) = (parts[0].clone(), parts[1].clone());
    let train = train.standardize(Stats::Own)?;
    let test = test.standardize(Stats::Like(&train))?;

    let f32s = |r: &[f64; 3]| r.map(|v| v as f32 as f64);
    let n = 40.0;
    let mean: Vec<f64> = (0..3)
        .map(|c| rows[..40].iter().map(|r| f32s(r)[c]).sum::<f64>() / n)
        .collect();
    let std: Vec<f64> = (0..3)
        .map(|c| {
            (rows[..40]
                .iter()
                .map(|r| (f32s(r)[c] - mean[c]).powi(2))
                .sum::<f64>()
                / n)
                .sqrt()
        })
        .collect();
    let stats = train.standardized().unwrap();
    for c in 0..2 {
        assert!((stats.mean()[c] as f64 - mean[c]).abs() <= 1e-6 * mean[c].abs().max(1.0));
        assert!(
            (stats.std()[c] as f64 - std[c]).abs() <= 1e-5 * std[c],
            "{c}"
        );
    }
    assert_eq!(stats.std()[2], 1.0, "a constant feature is only shifted");
    let check = |p: &Pipeline| -> Result<()> {
        for b in p.epoch(1, 7, 0) {
            let b = b?;
            for (row, &i) in b.x.to_vec2::<f32>()?.iter().zip(&b.indices) {
                let want = [0, 1, 2].map(|c| match std[c] {
                    0.0 => f32s(&rows[i])[c] - mean[c],
                    s => (f32s(&rows[i])[c] - mean[c]) / s,
                });
                for c in 0..3 {
                    assert!(
                        (row[c] as f64 - want[c]).abs() < 1e-5,
                        "{i} {c}: {} {}",
                        row[c],
                        want[c]
                    );
                }
            }
        }
        Ok(())
    };
    check(&train)?;
    check(&test)?;
    // Standardizing standardized data changes nothing (mean 0, deviation 1).
    let again = train.clone().standardize(Stats::Own)?;
    assert!(again
        .standardized()
        .unwrap()
        .mean()
        .iter()
        .all(|m| m.abs() < 1e-5));

    let ids = Pipeline::new(Arc::new(tokens(
        &write(dir.path(), "t.bin", &[1, 0, 2, 0, 3, 0, 4, 0]),
        TokenType::U16,
        2,
        None,
        "train",
    )?));
    assert!(err_text(ids.standardize(Stats::Own)).contains("not float features"));
    Ok(())
}

#[test]
fn tokens_are_windows_and_reject_partial_tokens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ids: Vec<u8> = (0u16..100).flat_map(|t| t.to_le_bytes()).collect();
    let path = write(dir.path(), "train.bin", &ids);
    let src = tokens(&path, TokenType::U16, 8, Some(4), "train")?;
    assert_eq!(src.len(), (100 - 9) / 4 + 1);
    let (x, y) = src.gather(&[2])?;
    assert_eq!(x.to_vec2::<u32>()?[0], (8..16).collect::<Vec<u32>>());
    assert_eq!(y.to_vec2::<u32>()?[0], (9..17).collect::<Vec<u32>>());
    let odd = write(dir.path(), "odd.bin", &ids[..199]);
    let msg = err_text(tokens(&odd, TokenType::U16, 8, None, "x"));
    assert!(
        msg.contains("odd.bin: offset 198: 1 trailing bytes"),
        "{msg}"
    );
    let wide = tokens(&path, TokenType::U32, 8, None, "x")?;
    assert_eq!(wide.gather(&[0])?.0.to_vec2::<u32>()?[0][0], 1 << 16);
    Ok(())
}

#[test]
fn text_file_builds_its_vocabulary() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write(dir.path(), "t.txt", "abcabcabcabc".repeat(10).as_bytes());
    let src = text(&path, None, "train", 4, None, 0.25)?;
    assert_eq!(src.vocab().map(|v| v.len()), Some(3));
    let bad = write(dir.path(), "bad.txt", b"ok\n\xe9t\xe9");
    let err = err_text(text(&bad, None, "train", 1, None, 0.1));
    assert!(
        err.contains("bad.txt: line 2, offset 3: byte 0xE9 is not UTF-8; a file saved in Latin-1 or Windows-1252")
            && err.contains("convert it: iconv -f WINDOWS-1252 -t UTF-8 "),
        "{err}"
    );
    // UTF-16 with its byte order mark (Notepad's "Unicode"), either order,
    // reads as the same text; a cut-off unit or a lone surrogate is named.
    let said = "Être ou ne pas être, \u{1F600} voilà.\r\n".repeat(8);
    let units: Vec<u16> = said.encode_utf16().collect();
    let le: Vec<u8> = [0xFF, 0xFE]
        .into_iter()
        .chain(units.iter().flat_map(|u| u.to_le_bytes()))
        .collect();
    let be: Vec<u8> = [0xFE, 0xFF]
        .into_iter()
        .chain(units.iter().flat_map(|u| u.to_be_bytes()))
        .collect();
    let utf8 = text(
        &write(dir.path(), "u8.txt", said.as_bytes()),
        None,
        "train",
        4,
        None,
        0.25,
    )?;
    for (name, bytes) in [("le.txt", &le), ("be.txt", &be)] {
        let src = text(
            &write(dir.path(), name, bytes),
            None,
            "train",
            4,
            None,
            0.25,
        )?;
        assert_eq!(src.vocab().map(|v| v.len()), utf8.vocab().map(|v| v.len()));
        assert_eq!(src.len(), utf8.len());
        assert_eq!(
            src.gather(&[0, 3])?.0.to_vec2::<u32>()?,
            utf8.gather(&[0, 3])?.0.to_vec2::<u32>()?
        );
    }
    let cut = write(dir.path(), "cut.txt", &le[..le.len() - 1]);
    let err = err_text(text(&cut, None, "train", 1, None, 0.1));
    assert!(
        err.contains("cut.txt: offset ") && err.contains("not UTF-16"),
        "{err}"
    );
    Ok(())
}

#[test]
fn safetensors_samples_read_rows_and_report_problems() -> Result<()> {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.safetensors");
    let x = Tensor::from_vec((0u8..20).collect::<Vec<_>>(), (5, 2, 2), &Device::Cpu)?;
    let y = Tensor::from_vec(vec![4i64, 3, 2, 1, 0], 5, &Device::Cpu)?;
    let ids = Tensor::from_vec((0u32..15).collect::<Vec<_>>(), (5, 3), &Device::Cpu)?;
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("images", x), ("labels", y), ("ids", ids)]),
        &path,
    )?;
    let src = samples(&path, "images", Targets::Labels("labels"), 2.0, "train")?;
    assert_eq!(src.len(), 5);
    let (x, y) = src.gather(&[3, 1])?;
    assert_eq!(x.dims(), &[2, 2, 2]);
    assert_eq!(
        x.flatten_all()?.to_vec1::<f32>()?,
        vec![6.0, 6.5, 7.0, 7.5, 2.0, 2.5, 3.0, 3.5]
    );
    assert_eq!(y.to_vec1::<u32>()?, vec![1, 3]);
    // The labels as numbers to predict: f32, one per sample, `[batch, 1]`.
    let src = samples(&path, "images", Targets::Values("labels"), 1.0, "train")?;
    let (_, y) = src.gather(&[3, 1])?;
    assert_eq!(y.to_vec2::<f32>()?, vec![vec![1.0], vec![3.0]]);
    assert!(src.describe().contains("target [5]"), "{}", src.describe());
    // A row of numbers per sample: as many targets, `[batch, k]`.
    let src = samples(&path, "images", Targets::Values("ids"), 1.0, "train")?;
    let (_, y) = src.gather(&[4, 0])?;
    assert_eq!(
        y.to_vec2::<f32>()?,
        vec![vec![12.0, 13.0, 14.0], vec![0.0, 1.0, 2.0]]
    );
    let msg = err_text(samples(&path, "ids", Targets::Values("images"), 1.0, "x"));
    assert!(
        msg.contains("tensor `images` has shape [5, 2, 2]: a `target` is a number per sample (shape [n]) or a row of them"),
        "{msg}"
    );
    let tokens = samples(&path, "ids", Targets::Labels("ids"), 1.0, "train")?;
    assert_eq!(
        tokens.gather(&[4])?.0.to_vec2::<u32>()?,
        vec![vec![12, 13, 14]]
    );

    let msg = err_text(samples(
        &path,
        "pixels",
        Targets::Labels("labels"),
        1.0,
        "x",
    ));
    assert!(
        msg.contains("no tensor named `pixels` (it has: ids, images, labels)"),
        "{msg}"
    );
    let bytes = std::fs::read(&path)?;
    let cut = write(dir.path(), "cut.safetensors", &bytes[..bytes.len() - 10]);
    let msg = err_text(samples(&cut, "images", Targets::Labels("labels"), 1.0, "x"));
    assert!(
        msg.contains("cut.safetensors: offset 0: not a safetensors file"),
        "{msg}"
    );
    let junk = write(dir.path(), "junk.safetensors", b"hello world, not a header");
    assert!(err_text(samples(
        &junk,
        "images",
        Targets::Labels("labels"),
        1.0,
        "x"
    ))
    .contains("junk.safetensors: offset 0"));
    Ok(())
}

/// A safetensors file's `target`: a linear model trained with the mean
/// squared error on it reaches, on held-out rows, the error of the float64
/// least-squares fit of the same rows (the best a linear model can do), in
/// the target's units: the target is standardized for training and the
/// scores given back in grams.
#[test]
fn a_safetensors_target_trains_a_regression_to_the_least_squares_error() -> Result<()> {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir()?;
    // x uniform in [0, 1)^3, y = 1000 + 200 x0 - 300 x1 + 50 x2 + N(0, 20).
    let mut s = 7u64;
    let mut uniform = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut rows = |n: usize| {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let v = [uniform(), uniform(), uniform()];
            let noise =
                (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
            x.extend(v);
            y.push(1000.0 + 200.0 * v[0] - 300.0 * v[1] + 50.0 * v[2] + 20.0 * noise);
        }
        (x, y)
    };
    let (train_x, train_y) = rows(512);
    let (test_x, test_y) = rows(256);
    // Train: f64 targets of shape [n]; test: f32 of shape [n, 1].
    let save = |name: &str, x: &[f64], y: Tensor| -> Result<()> {
        let n = x.len() / 3;
        let x = Tensor::from_vec(
            x.iter().map(|v| *v as f32).collect::<Vec<_>>(),
            (n, 3),
            &Device::Cpu,
        )?;
        candle_core::safetensors::save(
            &std::collections::HashMap::from([("x", x), ("mass", y)]),
            dir.path().join(name),
        )?;
        Ok(())
    };
    save(
        "train.safetensors",
        &train_x,
        Tensor::from_vec(train_y.clone(), 512, &Device::Cpu)?,
    )?;
    let test_t: Vec<f32> = test_y.iter().map(|v| *v as f32).collect();
    save(
        "test.safetensors",
        &test_x,
        Tensor::from_vec(test_t.clone(), (256, 1), &Device::Cpu)?,
    )?;

    let recipe = r#"
        local train = taper.data.safetensors{ path = "DIR/train.safetensors", target = "mass", split = "train" }:standardize()
        local test = taper.data.safetensors{ path = "DIR/test.safetensors", target = "mass", split = "test" }:standardize(train)
        local run = taper.run{
          model = taper.model.mlp{ inputs = 3, outputs = 1 },
          optim = taper.optim.adamw{ lr = 1e-2, weight_decay = 0 },
          loss = taper.loss.mse{},
          data = train:shuffle():batch(32),
        }
        for _ in run:epochs(40) do
          for b in run:batches() do run:step(b) end
        end
        run:evaluate(test:batch(64))
    "#
    .replace("DIR", dir.path().to_str().unwrap());
    let report =
        taper::Host::new(taper::HostOptions::default())?.run_source("recipe.lua", &recipe)?;
    let g = report.runs[0]
        .last_eval
        .clone()
        .unwrap()
        .regression
        .expect("scores");

    // Least squares in float64 on the same rows (x as the file holds it).
    let design = |x: &[f64]| -> Vec<[f64; 4]> {
        x.chunks(3)
            .map(|r| {
                [
                    1.0,
                    r[0] as f32 as f64,
                    r[1] as f32 as f64,
                    r[2] as f32 as f64,
                ]
            })
            .collect()
    };
    let a = design(&train_x);
    let mut m = [[0.0f64; 5]; 4];
    for (r, y) in a.iter().zip(&train_y) {
        for i in 0..4 {
            for j in 0..4 {
                m[i][j] += r[i] * r[j];
            }
            m[i][4] += r[i] * y;
        }
    }
    for c in 0..4 {
        for r in 0..4 {
            if r != c {
                let pivot = m[c];
                let f = m[r][c] / pivot[c];
                for (a, b) in m[r].iter_mut().zip(pivot) {
                    *a -= f * b;
                }
            }
        }
    }
    let w: Vec<f64> = (0..4).map(|i| m[i][4] / m[i][i]).collect();
    let sq: f64 = design(&test_x)
        .iter()
        .zip(&test_t)
        .map(|(r, y)| {
            let p: f64 = r.iter().zip(&w).map(|(a, b)| a * b).sum();
            (p - *y as f64).powi(2)
        })
        .sum();
    let ls_rmse = (sq / 256.0).sqrt();
    // Measured: least squares 19.53 g, taper 19.51 g (R² 0.970).
    assert!(ls_rmse > 15.0 && ls_rmse < 25.0, "least squares {ls_rmse}");
    assert!(
        g.rmse() < 1.02 * ls_rmse && g.rmse() > 0.95 * ls_rmse,
        "taper {} g, least squares {ls_rmse} g",
        g.rmse()
    );
    assert!(g.r2() > 0.9, "{g:?}");
    Ok(())
}

/// Samples shaped as NumPy and PyTorch hold images train as flat ones do:
/// an MLP reads `[n, 4, 4]` in order, a CNN takes `[n, 1, 4, 4]` and (grey)
/// `[n, 4, 4]`, each to the same loss, bitwise, as the flat file. A
/// channels-last file (`[n, 4, 4, 3]`, as Keras holds images), which has as
/// many values as the CNN's `{3, 4, 4}` but in another order, is refused
/// before a step, saying to transpose it; `[n, 3, 4, 4]` trains.
#[test]
fn shaped_samples_train_as_flat_ones_and_channels_last_is_refused() -> Result<()> {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir()?;
    let n = 64;
    let x = Tensor::randn(0f32, 1.0, (n, 3, 4, 4), &Device::Cpu)?;
    // The class: whether the first channel's top half outweighs its bottom.
    let top = x.narrow(1, 0, 1)?.narrow(2, 0, 2)?.sum((1, 2, 3))?;
    let bottom = x.narrow(1, 0, 1)?.narrow(2, 2, 2)?.sum((1, 2, 3))?;
    let y = top.ge(&bottom)?.to_dtype(candle_core::DType::U32)?;
    let grey = x.narrow(1, 0, 1)?.contiguous()?;
    let save = |name: &str, x: Tensor| -> Result<()> {
        candle_core::safetensors::save(
            &std::collections::HashMap::from([("x", x), ("y", y.clone())]),
            dir.path().join(name),
        )?;
        Ok(())
    };
    save("flat.safetensors", grey.reshape((n, 16))?)?;
    save("grey.safetensors", grey.reshape((n, 4, 4))?)?;
    save("chw.safetensors", grey.clone())?;
    save("rgb.safetensors", x.clone())?;
    save(
        "rgb_last.safetensors",
        x.permute((0, 2, 3, 1))?.contiguous()?,
    )?;
    let train = |file: &str, model: &str| -> taper::Result<f64> {
        let recipe = format!(
            r#"
            local data = taper.data.safetensors{{ path = "{}", scale = 1 }}
            local run = taper.run{{ model = {model}, data = data:batch(16), seed = 3 }}
            for _ in run:epochs(3) do
              for b in run:batches() do run:step(b) end
            end
            run:evaluate(data:batch(64))
            "#,
            dir.path().join(file).display()
        );
        let report =
            taper::Host::new(taper::HostOptions::default())?.run_source("recipe.lua", &recipe)?;
        Ok(report.runs[0]
            .last_eval
            .clone()
            .expect("an evaluation")
            .loss)
    };
    let mlp = "taper.model.mlp{ inputs = 16, hidden = { 8 }, outputs = 2 }";
    let cnn = |c: usize| {
        format!("taper.model.cnn{{ input = {{ {c}, 4, 4 }}, channels = {{ 4 }}, outputs = 2 }}")
    };
    let flat = train("flat.safetensors", mlp)?;
    assert_eq!(train("grey.safetensors", mlp)?.to_bits(), flat.to_bits());
    assert!(flat.is_finite(), "loss {flat}");
    let flat = train("flat.safetensors", &cnn(1))?;
    for file in ["grey.safetensors", "chw.safetensors"] {
        assert_eq!(train(file, &cnn(1))?.to_bits(), flat.to_bits(), "{file}");
    }
    assert!(train("rgb.safetensors", &cnn(3))?.is_finite());
    let e = err_text(train("rgb_last.safetensors", &cnn(3)));
    assert!(
        e.contains("each sample has shape [4, 4, 3], the model takes [3, 4, 4]")
            && e.contains("channels last")
            && e.contains("np.transpose(x, (0, 3, 1, 2))"),
        "{e}"
    );
    Ok(())
}

/// A small tokenizer.json (word level, split on whitespace), in the format the
/// `tokenizers` library writes.
const TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": { "type": "Whitespace" }, "post_processor": null,
  "decoder": null,
  "model": { "type": "WordLevel", "vocab": { "[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5 }, "unk_token": "[UNK]" }
}"#;

#[test]
fn text_with_a_tokenizer_json() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = write(dir.path(), "tokenizer.json", TOKENIZER.as_bytes());
    let path = write(
        dir.path(),
        "t.txt",
        "the cat sat on the mat\n".repeat(20).as_bytes(),
    );
    let src = text(&path, Some(&tok), "all", 6, None, 0.0)?;
    let v = src.vocab().expect("a vocabulary");
    assert_eq!(v.len(), 6);
    assert_eq!(v.encode("the cat sat")?, vec![1, 2, 3]);
    assert_eq!(v.decode(&[1, 2, 3, 4, 1, 5]), "the cat sat on the mat");
    assert_eq!(src.len(), (120 - 7) / 6 + 1);
    let (x, y) = src.gather(&[0])?;
    assert_eq!(x.to_vec2::<u32>()?[0], vec![1, 2, 3, 4, 1, 5]);
    assert_eq!(y.to_vec2::<u32>()?[0], vec![2, 3, 4, 1, 5, 1]);
    let bad = write(dir.path(), "bad.json", b"{ \"model\": 3 }");
    assert!(err_text(text(&path, Some(&bad), "all", 6, None, 0.0))
        .contains("bad.json: not a readable tokenizer.json"));
    Ok(())
}

/// Two CSV columns of text are a pair, `[CLS] a [SEP] b [SEP]` (the longer
/// text cut first, as transformers' `truncation=True`); a first text that
/// holds the separator itself is refused, naming its line, since the
/// second text's token types start after the first separator.
#[test]
fn two_csv_columns_of_text_are_a_pair() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = write(
        dir.path(),
        "tokenizer.json",
        common::BERT_TOKENIZER.as_bytes(),
    );
    let opts = CsvOptions {
        label: Column::Name("label".into()),
        text: Some(taper::data::TextOptions {
            columns: vec![Column::Name("a".into()), Column::Name("b".into())],
            tokenizer: tok.clone(),
            context: 7,
        }),
        ..CsvOptions::default()
    };
    let path = write(
        dir.path(),
        "pairs.csv",
        b"a,b,label\nthe cat sat on the mat,mat,x\nthe,cat sat,y\n",
    );
    let src = csv(&path, &opts)?;
    let (x, _) = src.gather(&[0, 1])?;
    assert_eq!(
        x.to_vec2::<u32>()?,
        [[2, 4, 5, 6, 3, 8, 3], [2, 4, 3, 5, 6, 3, 0]]
    );
    assert_eq!(lines(src.cut()), [2]);
    assert!(
        src.describe().contains("rows of text columns `a` and `b`"),
        "{}",
        src.describe()
    );
    let bad = write(dir.path(), "bad.csv", b"a,b,label\nthe [SEP] cat,mat,x\n");
    let e = err_text(csv(&bad, &opts));
    assert!(
        e.contains("bad.csv: line 2, columns `a` and `b`: the first text holds the separator token (`[SEP]`)"),
        "{e}"
    );
    Ok(())
}

/// A CSV column of text: each cell tokenized with the tokenizer's special
/// tokens, cut at `context` (its `[SEP]` kept, the cut counted) and padded
/// with its padding token; the header is implied; class names sorted.
#[test]
fn a_csv_column_of_text_becomes_the_tokenizers_padded_ids() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = write(
        dir.path(),
        "tokenizer.json",
        common::BERT_TOKENIZER.as_bytes(),
    );
    let path = write(
        dir.path(),
        "t.csv",
        b"label,text\nb,the cat sat\na,\"the cat, on the mat, sat on the mat\"\nb,mat\n",
    );
    let opts = |context: usize, label: Column| CsvOptions {
        label,
        text: Some(taper::data::TextOptions {
            columns: vec![Column::Index(1)],
            tokenizer: tok.clone(),
            context,
        }),
        ..CsvOptions::default()
    };
    let src = csv(&path, &opts(6, Column::Index(0)))?;
    assert_eq!(src.len(), 3, "the header is not a sample");
    assert_eq!(src.classes(), Some(&["a".to_string(), "b".to_string()][..]));
    assert_eq!(lines(src.cut()), [3]);
    assert_eq!(src.lengths(), Some(vec![5, 6, 3]));
    let (x, y) = src.gather(&[0, 1, 2])?;
    assert_eq!(
        x.to_vec2::<u32>()?,
        vec![
            vec![2, 4, 5, 6, 3, 0],
            vec![2, 4, 5, 9, 7, 3],
            vec![2, 8, 3, 0, 0, 0]
        ]
    );
    assert_eq!(y.to_vec1::<u32>()?, vec![1, 0, 1]);
    let d = src.describe();
    assert!(
        d.contains("3 rows of text `text`, up to 6 ids of tokenizer.json"),
        "{d}"
    );
    let text = src
        .table_input()
        .and_then(|t| t.text)
        .expect("the reading of its texts");
    assert_eq!((text.context, text.pad), (6, 0));
    assert_eq!(text.tokenizer["model"]["vocab"]["mat"], 8);

    // A source of the same file and options (a reloaded recipe's) shares
    // the tokenization; another context, or an edited file, does not.
    assert!(src.shares_texts_with(&csv(&path, &opts(6, Column::Index(0)))?));
    assert!(!src.shares_texts_with(&csv(&path, &opts(7, Column::Index(0)))?));
    let edited = write(
        dir.path(),
        "t.csv",
        b"label,text\nb,the cat sat\na,\"the cat, on the mat, sat on the mat\"\nb,mat on\n",
    );
    let again = csv(&edited, &opts(6, Column::Index(0)))?;
    assert!(!src.shares_texts_with(&again));
    assert_eq!(again.lengths(), Some(vec![5, 6, 4]));

    let pad = write(
        dir.path(),
        "pad.csv",
        b"label,text\nb,the cat\na,the [PAD] mat\n",
    );
    let e = err_text(csv(&pad, &opts(6, Column::Index(0))));
    assert!(
        e.contains("pad.csv") && e.contains("line 3, column 2") && e.contains("`[PAD]`"),
        "{e}"
    );
    let missing = write(dir.path(), "missing.csv", b"label,text\nb,the cat\na,\n");
    let e = err_text(csv(&missing, &opts(6, Column::Index(0))));
    assert!(
        e.contains("line 3, column 2 (`text`): a missing value"),
        "{e}"
    );
    Ok(())
}

/// The built-in Shakespeare with a tokenizer is the same data as its file
/// read by `text` with that tokenizer: a recipe needs no path into the
/// source tree to fine-tune a tokenized model on it.
#[test]
fn built_in_shakespeare_in_a_tokenizers_tokens_is_its_file_read_as_text() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tok = write(dir.path(), "tokenizer.json", TOKENIZER.as_bytes());
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data/builtin/shakespeare.txt.gz");
    for split in ["train", "val"] {
        let built_in = taper::data::shakespeare_tokens(split, 8, Some(5), &tok)?;
        let read = text(&file, Some(&tok), split, 8, Some(5), 0.1)?;
        assert_eq!(built_in.len(), read.len(), "{split}");
        assert!(built_in.len() > 1000, "{split}: {} windows", built_in.len());
        let rows: Vec<usize> = (0..built_in.len()).collect();
        let (bx, by) = built_in.gather(&rows)?;
        let (rx, ry) = read.gather(&rows)?;
        let words = bx.flatten_all()?.to_vec1::<u32>()?;
        assert!(
            words.iter().filter(|&&id| id > 0).count() > 20,
            "{split}: all unknown"
        );
        assert_eq!(bx.to_vec2::<u32>()?, rx.to_vec2::<u32>()?, "{split}");
        assert_eq!(by.to_vec2::<u32>()?, ry.to_vec2::<u32>()?, "{split}");
        assert_eq!(built_in.vocab().map(|v| v.len()), Some(6));
    }
    Ok(())
}

/// `cat a.gz b.gz` (and bgzip, which writes many members) is one stream:
/// every member is read, not only the first.
#[test]
fn a_multi_member_gzip_is_read_whole() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = (
        "the cat sat on the mat\n".repeat(30),
        "on the mat the cat\n".repeat(40),
    );
    let mut both = gz(a.as_bytes());
    both.extend(gz(b.as_bytes()));
    let path = write(dir.path(), "t.txt.gz", &both);
    let whole = write(dir.path(), "t.txt", format!("{a}{b}").as_bytes());
    let (from_gz, plain) = (
        text(&path, None, "all", 8, None, 0.0)?,
        text(&whole, None, "all", 8, None, 0.0)?,
    );
    assert_eq!(from_gz.len(), plain.len());
    let last = plain.len() - 1;
    assert_eq!(
        from_gz.gather(&[last])?.0.to_vec2::<u32>()?,
        plain.gather(&[last])?.0.to_vec2::<u32>()?
    );
    Ok(())
}

/// A tokenizer.json made for a model's inputs (truncation to 8 tokens,
/// padding) does not cut the corpus: both are turned off, and said so.
#[test]
fn a_tokenizer_with_truncation_and_padding_tokenizes_the_whole_text() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let with = TOKENIZER
        .replace(
            "\"truncation\": null",
            r#""truncation": { "direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0 }"#,
        )
        .replace(
            "\"padding\": null",
            r#""padding": { "strategy": { "Fixed": 16 }, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "[UNK]" }"#,
        );
    assert_ne!(with, TOKENIZER);
    let tok = write(dir.path(), "tokenizer.json", with.as_bytes());
    let path = write(
        dir.path(),
        "t.txt",
        "the cat sat on the mat\n".repeat(20).as_bytes(),
    );
    let src = text(&path, Some(&tok), "all", 6, None, 0.0)?;
    assert_eq!(src.len(), (120 - 7) / 6 + 1, "all 120 tokens");
    let notes = src.vocab().expect("a vocabulary").notes().join("\n");
    assert!(
        notes.contains("its truncation (to 8 tokens) is turned off"),
        "{notes}"
    );
    assert!(notes.contains("its padding is turned off"), "{notes}");
    Ok(())
}

/// A data file written in place while a run reads it (a data script run
/// again on the same path) is an error at the next batch, naming the file,
/// where a truncated mapping used to end the process with SIGBUS and
/// nothing saved. The run stops with its checkpoint (exit 2).
#[test]
fn a_data_file_truncated_while_the_run_reads_it_stops_the_run_with_a_checkpoint() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ids: Vec<u8> = (0..20_000u32)
        .flat_map(|i| ((i * 7 % 50) as u16).to_le_bytes())
        .collect();
    let data = write(dir.path(), "train.bin", &ids);
    let recipe = write(
        dir.path(),
        "cut.lua",
        format!(
            r#"local path = "{}"
local run = taper.run{{
  model = taper.model.gpt{{ vocab = 50, context = 8, width = 16, heads = 2, layers = 1 }},
  data = taper.data.tokens{{ path = path, context = 8 }}:shuffle{{ seed = 1 }}:batch(4),
}}
for _ in run:epochs(1) do
  for b in run:batches() do
    run:step(b)
    if run.steps == 3 then io.open(path, "w"):close() end
  end
end
"#,
            data.display()
        )
        .as_bytes(),
    );
    let out = dir.path().join("out");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_taper"))
        .args(["train", recipe.to_str().unwrap(), "--quiet", "--out"])
        .arg(&out)
        .output()?;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{:?}: {err}", o.status);
    let says = format!(
        "{}: the file was written while the run read it (0 bytes where it had 40000): the run stops here; rerun with --resume to go on with the file as it is now",
        data.display()
    );
    assert!(err.contains(&says), "{err}");
    let saved: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))?
        .lines()
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let saved: Vec<_> = saved
        .iter()
        .filter(|r| r["event"] == "checkpoint")
        .collect();
    assert_eq!(saved.len(), 1);
    assert_eq!(
        (&saved[0]["step"], &saved[0]["reason"]),
        (&3.into(), &"failed".into())
    );
    Ok(())
}

/// Written over in place with the same size, the file is caught by its
/// modification time: the run would otherwise mix two data sets.
#[test]
fn a_data_file_written_over_in_place_is_caught_at_the_next_read() -> Result<()> {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.safetensors");
    let x = Tensor::from_vec((0u8..20).collect::<Vec<_>>(), (5, 4), &Device::Cpu)?;
    let y = Tensor::from_vec(vec![4u8, 3, 2, 1, 0], 5, &Device::Cpu)?;
    let tensors = std::collections::HashMap::from([("x", x), ("y", y)]);
    candle_core::safetensors::save(&tensors, &path)?;
    let ids: Vec<u8> = (0u16..100).flat_map(|t| t.to_le_bytes()).collect();
    let bin = write(dir.path(), "train.bin", &ids);
    let src = samples(&path, "x", Targets::Labels("y"), 1.0, "train")?;
    let toks = tokens(&bin, TokenType::U16, 8, None, "train")?;
    src.gather(&[0, 1])?;
    toks.gather(&[0, 1])?;
    for p in [&path, &bin] {
        let f = std::fs::OpenOptions::new().write(true).open(p)?;
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))?;
    }
    for (msg, p) in [
        (err_text(src.gather(&[2])), &path),
        (err_text(toks.gather(&[2])), &bin),
    ] {
        let bytes = std::fs::metadata(p)?.len();
        let says = format!(
            "{}: the file was written while the run read it ({bytes} bytes, as before)",
            p.display()
        );
        assert!(msg.contains(&says), "{msg}");
    }
    Ok(())
}

/// A PNG of `h x w` RGB pixels, each `f(y, x)`.
fn png(path: &Path, h: u32, w: u32, f: impl Fn(u32, u32) -> [u8; 3]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::RgbImage::from_fn(w, h, |x, y| image::Rgb(f(y, x)))
        .save(path)
        .unwrap();
}

/// An image folder: classes in sorted order, images in `ImageFolder`'s
/// order (folder, then name), hidden folders and other files passed over,
/// a link that loops followed once;
/// PNG pixels exact, channel first, divided by `scale`; grey as PIL's
/// luma. (tests/interop.rs compares it with Pillow and ImageFolder's code.)
#[test]
fn an_image_folder_reads_classes_in_order_with_exact_pixels() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let px = |i: u8| move |y: u32, x: u32| [i, (y * 4 + x) as u8, 200 - i];
    png(&root.join("b/x.png"), 3, 4, px(4));
    png(&root.join("a/2.png"), 3, 4, px(2));
    png(&root.join("a/10.png"), 3, 4, px(1));
    png(&root.join("a/sub/0.png"), 3, 4, px(3));
    png(&root.join(".ipynb_checkpoints/y.png"), 9, 9, px(9));
    png(&root.join("a/.hidden.png"), 9, 9, px(9));
    write(&root.join("b"), "notes.txt", b"not an image");
    // A link back up the tree is followed once, not for ever.
    std::os::unix::fs::symlink("..", root.join("a/sub/up"))?;
    let src = taper::data::images(root, None, 3, 2.0, "train")?;
    assert_eq!(src.classes(), ["a", "b"]);
    assert_eq!((src.len(), src.split()), (4, "train"));
    let (x, y) = src.gather(&[0, 1, 2, 3])?;
    assert_eq!(y.to_vec1::<u32>()?, [0, 0, 0, 1]);
    let x = x.to_vec2::<f32>()?;
    for (row, i) in x.iter().zip([1u8, 2, 3, 4]) {
        // Channel first: 12 red values, 12 green, 12 blue.
        let mut want = vec![i as f32 / 2.0; 12];
        want.extend((0..12).map(|g| g as f32 / 2.0));
        want.extend(vec![(200 - i) as f32 / 2.0; 12]);
        assert_eq!(row, &want);
    }
    let grey = taper::data::images(root, None, 1, 1.0, "train")?;
    let (g, _) = grey.gather(&[3])?;
    let luma = |r: u32, g: u32, b: u32| ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as f32;
    let want: Vec<f32> = (0..12).map(|v| luma(4, v, 196)).collect();
    assert_eq!(g.to_vec2::<f32>()?[0], want);
    let resized = taper::data::images(root, Some((2, 5)), 3, 255.0, "train")?;
    assert_eq!(resized.gather(&[0])?.0.dims(), [1, 30]);
    Ok(())
}

/// What an image folder can get wrong is an error naming the folder or the
/// file: no class folders, a class without images, images of several sizes
/// without `size`, a file that is not an image, one that changed since.
#[test]
fn image_folder_errors_name_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let msg = err_text(taper::data::images(root, None, 3, 255.0, "x"));
    assert!(msg.contains("holds no class folders"), "{msg}");
    std::fs::create_dir(root.join("empty"))?;
    png(&root.join("full/a.png"), 4, 4, |_, _| [1, 2, 3]);
    let msg = err_text(taper::data::images(root, None, 3, 255.0, "x"));
    assert!(
        msg.contains("empty: class `empty` holds no image (.jpg, .jpeg, .png"),
        "{msg}"
    );
    // A class of GIFs alone says what it passed over.
    std::fs::write(root.join("empty/a.gif"), b"GIF89a")?;
    let msg = err_text(taper::data::images(root, None, 3, 255.0, "x"));
    assert!(
        msg.contains("empty: class `empty` holds no image: passed over 1 file not of a type read as an image (.gif: 1, such as "),
        "{msg}"
    );
    std::fs::remove_file(root.join("empty/a.gif"))?;
    std::fs::remove_dir(root.join("empty"))?;
    png(&root.join("full/b.png"), 5, 4, |_, _| [1, 2, 3]);
    let msg = err_text(taper::data::images(root, None, 3, 255.0, "x"));
    assert!(
        msg.contains("b.png: 5x4 pixels, where ")
            && msg.contains("a.png has 4x4 (height x width): give `size`"),
        "{msg}"
    );
    let src = taper::data::images(root, Some((4, 4)), 3, 255.0, "x")?;
    png(&root.join("full/a.png"), 2, 2, |_, _| [1, 2, 3]);
    assert_eq!(src.gather(&[0])?.0.dims(), [1, 48], "resized again");
    write(&root.join("full"), "c.jpg", b"\xff\xd8 not really a JPEG");
    let msg = err_text(taper::data::images(root, Some((4, 4)), 3, 255.0, "x"));
    assert!(msg.contains("c.jpg: not a readable image"), "{msg}");
    write(&root.join("full"), "c.jpg", b"GIF89a");
    let msg = err_text(taper::data::images(root, Some((4, 4)), 3, 255.0, "x"));
    assert!(
        msg.contains("c.jpg: ") && msg.contains("taper reads PNG, JPEG"),
        "{msg}"
    );
    std::fs::remove_file(root.join("full/c.jpg"))?;
    let fixed = taper::data::images(root, None, 3, 255.0, "x");
    assert!(err_text(fixed).contains("give `size`"));
    std::fs::remove_file(root.join("full/b.png"))?;
    let src = taper::data::images(root, None, 3, 255.0, "x")?;
    png(&root.join("full/a.png"), 3, 3, |_, _| [1, 2, 3]);
    let msg = err_text(src.gather(&[0]));
    assert!(
        msg.contains("a.png: now 3x3 pixels, where the data's images are 2x2"),
        "{msg}"
    );
    Ok(())
}

/// A truncated image (a partial copy or download) is an error naming the
/// file when its batch is built, as Pillow's "image file is truncated": a
/// JPEG whose header is whole too, which the decoder would fill with grey.
#[test]
fn a_truncated_jpeg_is_named_where_its_batch_is_built() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    png(&root.join("a/0.png"), 16, 16, |y, x| {
        [(x * 9) as u8, (y * 13) as u8, 7]
    });
    let rgb = image::RgbImage::from_fn(16, 16, |x, y| {
        image::Rgb([(x * 9) as u8, (y * 13) as u8, 7])
    });
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&rgb)?;
    write(&root.join("a"), "1.jpg", &jpeg);
    let whole = taper::data::images(root, None, 3, 255.0, "x")?;
    assert_eq!(whole.gather(&[0, 1])?.0.dims(), [2, 768]);

    let cut = jpeg.len() * 9 / 10;
    write(&root.join("a"), "1.jpg", &jpeg[..cut]);
    let src = taper::data::images(root, None, 3, 255.0, "x")?;
    let msg = err_text(src.gather(&[1]));
    assert!(
        msg.contains(&format!(
            "1.jpg: offset {cut}: truncated: the JPEG data ends before its end-of-image marker"
        )),
        "{msg}"
    );
    assert_eq!(src.gather(&[0])?.0.dims(), [1, 768], "the PNG reads");
    Ok(())
}

/// An image folder labelled by another's classes (`classes =
/// train:classes()`): a class without a folder has no images and keeps its
/// label, the others keep theirs; a folder not among the classes, a class
/// named twice, or none, is an error naming the folder.
#[test]
fn an_image_folder_labelled_by_given_classes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    png(&root.join("cat/1.png"), 2, 2, |_, _| [1, 1, 1]);
    png(&root.join("dog/1.png"), 2, 2, |_, _| [2, 2, 2]);
    let names = |s: &str| -> Vec<String> { s.split(' ').map(String::from).collect() };
    let src = taper::data::images_of(root, &names("bird cat dog"), None, 1, 1.0, "val")?;
    assert_eq!(src.classes(), ["bird", "cat", "dog"]);
    assert_eq!(src.len(), 2);
    let (x, y) = src.gather(&[0, 1])?;
    assert_eq!(y.to_vec1::<u32>()?, [1, 2]);
    assert_eq!(x.to_vec2::<f32>()?[1], [2.0; 4]);
    // The given order is the labels' order (and the samples'), not the
    // folder's: label 0 is dog.
    let src = taper::data::images_of(root, &names("dog cat"), None, 1, 1.0, "val")?;
    let (x, y) = src.gather(&[0, 1])?;
    assert_eq!(y.to_vec1::<u32>()?, [0, 1]);
    assert_eq!(x.to_vec2::<f32>()?[0], [2.0; 4]);
    let msg = err_text(taper::data::images_of(
        root,
        &names("cat"),
        None,
        1,
        1.0,
        "val",
    ));
    assert!(
        msg.contains("dog: a class folder that is not one of the 1 `classes` given (`cat`)"),
        "{msg}"
    );
    let msg = err_text(taper::data::images_of(
        root,
        &names("cat dog cat"),
        None,
        1,
        1.0,
        "val",
    ));
    assert!(msg.contains("`classes` names `cat` twice"), "{msg}");
    let msg = err_text(taper::data::images_of(root, &[], None, 1, 1.0, "val"));
    assert!(msg.contains("`classes` is empty"), "{msg}");
    Ok(())
}

/// `ImageInput` (saved with a checkpoint, for `taper classify`) reads a
/// file as the folder read it for training, resize included; a file that
/// is not an image is named.
#[test]
fn an_image_input_reads_a_file_as_its_folder_did() -> Result<()> {
    use taper::data::Source;
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    png(&root.join("a/1.png"), 7, 5, |y, x| {
        [(y * 30) as u8, (x * 40) as u8, 9]
    });
    for channels in [1, 3] {
        let src = taper::data::images(root, Some((4, 3)), channels, 2.0, "x")?;
        let input = src.image_input().unwrap();
        assert_eq!(
            (input.size, input.channels, input.scale),
            ([4, 3], channels, 2.0)
        );
        let (x, _) = src.gather(&[0])?;
        assert_eq!(input.read(&root.join("a/1.png"))?, x.to_vec2::<f32>()?[0]);
    }
    write(root, "b.png", b"not a PNG");
    let input = taper::data::images(root, None, 1, 1.0, "x")?.input();
    let msg = err_text(input.read(&root.join("b.png")));
    assert!(msg.contains("b.png: not a readable image"), "{msg}");
    Ok(())
}

/// `standardize` on an image folder's samples is per channel (torchvision's
/// `Normalize` with the data's own mean and deviation, computed here in f64
/// over every pixel of the channel); the image input the pipeline reports
/// carries the statistics, and reads a file to the batch's values, bit for
/// bit. Given statistics must be one per channel, per value or for all.
#[test]
fn standardizing_images_is_per_channel_and_the_image_input_keeps_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    for i in 0..5u32 {
        png(&root.join(format!("c{}/{i}.png", i % 2)), 4, 3, |y, x| {
            [
                (i * 40 + y * 9) as u8,
                (x * 60 + i) as u8,
                200 - (i * 7) as u8,
            ]
        });
    }
    let folder = Arc::new(taper::data::images(root, None, 3, 255.0, "train")?);
    let (x, _) = folder.gather(&[0, 1, 2, 3, 4])?;
    let raw = x.to_vec2::<f32>()?;
    let data = Pipeline::new(folder.clone()).standardize(Stats::Own)?;
    let stats = data.standardized().unwrap();
    assert_eq!((stats.mean().len(), stats.span()), (3, 12));
    for c in 0..3 {
        let px: Vec<f64> = raw
            .iter()
            .flat_map(|r| r[c * 12..(c + 1) * 12].iter().map(|&v| v as f64))
            .collect();
        let mean = px.iter().sum::<f64>() / px.len() as f64;
        let std = (px.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / px.len() as f64).sqrt();
        assert!((stats.mean()[c] as f64 - mean).abs() < 1e-6, "{c}");
        assert!((stats.std()[c] as f64 - std).abs() < 1e-6 * std, "{c}");
    }
    let input = data
        .image_input()
        .expect("a standardized folder keeps its reading");
    assert_eq!(input.standardize.as_ref().map(|m| m.mean.len()), Some(3));
    let batch = data.epoch(1, 5, 0).next().unwrap()?;
    let rows = batch.x.to_vec2::<f32>()?;
    for (row, &i) in rows.iter().zip(&batch.indices) {
        let file = &taper::data::image_files(root)?.images[i];
        assert_eq!(&input.read(file)?, row, "{}", file.display());
    }

    let given = |mean: Vec<f32>| {
        Pipeline::new(folder.clone()).standardize(Stats::Given(taper::data::Moments {
            std: vec![0.5; mean.len()],
            mean,
        }))
    };
    assert_eq!(given(vec![0.5])?.standardized().unwrap().span(), 36);
    assert_eq!(
        given(vec![0.1, 0.2, 0.3])?.standardized().unwrap().span(),
        12
    );
    assert!(err_text(given(vec![0.1, 0.2])).contains("2 means for samples of 36 features"));
    assert!(err_text(given(vec![0.0; 4]))
        .contains("give one per feature, one per channel, or one for all"));
    Ok(())
}

/// An image folder's augmentation, as torchvision's transforms: a flip
/// mirrors about half the images, a padded crop shifts each by at most the
/// padding with zeros shifted in (every shift drawn), and a resized crop of
/// the whole image is the plain resize. Each draw depends on the epoch and
/// the sample alone: the same again, whatever else is in the batch.
#[test]
fn image_folder_augmentation_draws_per_epoch_and_sample() -> Result<()> {
    use taper::data::Augment;
    let dir = tempfile::tempdir()?;
    let (h, w) = (6u32, 8u32);
    for i in 0..4u32 {
        png(&dir.path().join(format!("c/{i}.png")), h, w, |y, x| {
            [(i * 50 + y * 8 + x) as u8, 1 + x as u8, 1 + y as u8]
        });
    }
    let plain = taper::data::images(dir.path(), None, 3, 1.0, "train")?;
    let (x, _) = plain.gather(&[0, 1, 2, 3])?;
    let originals = x.to_vec2::<f32>()?;
    let at = |img: &[f32], c: u32, y: i64, x: i64| -> f32 {
        if (0..h as i64).contains(&y) && (0..w as i64).contains(&x) {
            img[(c * h * w) as usize + (y as u32 * w + x as u32) as usize]
        } else {
            0.0
        }
    };
    // The image shifted by (dy, dx), and mirrored when `flip`.
    let moved = |img: &[f32], dy: i64, dx: i64, flip: bool| -> Vec<f32> {
        let mut out = Vec::new();
        for c in 0..3 {
            for y in 0..h as i64 {
                for x in 0..w as i64 {
                    let sx = if flip { w as i64 - 1 - x } else { x };
                    out.push(at(img, c, y + dy, sx + dx));
                }
            }
        }
        out
    };
    let read =
        |a: Augment| taper::data::images(dir.path(), None, 3, 1.0, "train").map(|s| s.augmented(a));
    let flips = read(Augment {
        seed: 3,
        flip: true,
        ..Augment::default()
    })?;
    let shifts = read(Augment {
        seed: 3,
        pad_crop: 2,
        ..Augment::default()
    })?;
    let (mut flipped, mut offsets) = (0, std::collections::HashSet::new());
    for epoch in 1..=60 {
        let (fx, _) = flips.gather_epoch(&[0, 1, 2, 3], epoch)?;
        let (sx, _) = shifts.gather_epoch(&[0, 1, 2, 3], epoch)?;
        for (i, (f, s)) in fx
            .to_vec2::<f32>()?
            .iter()
            .zip(sx.to_vec2::<f32>()?)
            .enumerate()
        {
            let o = &originals[i];
            if *f == moved(o, 0, 0, true) {
                flipped += 1;
            } else {
                assert_eq!(
                    f, o,
                    "epoch {epoch}, image {i}: neither the image nor its mirror"
                );
            }
            let shift = (-2..=2)
                .flat_map(|dy| (-2..=2).map(move |dx| (dy, dx)))
                .find(|&(dy, dx)| s == moved(o, dy, dx, false));
            offsets.insert(shift.expect("not a shift of the image by at most 2"));
        }
        // The same draws again, and whatever else the batch holds.
        let (again, _) = flips.gather_epoch(&[3, 1], epoch)?;
        assert_eq!(again.to_vec2::<f32>()?[0], fx.to_vec2::<f32>()?[3]);
    }
    assert!((80..=160).contains(&flipped), "{flipped} of 240 flipped");
    assert_eq!(offsets.len(), 25, "shifts drawn: {offsets:?}");

    let whole = Augment {
        resized_crop: Some(((1.0, 1.0), (w as f64 / h as f64, w as f64 / h as f64))),
        ..Augment::default()
    };
    let sized = |a: Option<Augment>| -> Result<Vec<Vec<f32>>> {
        let s = taper::data::images(dir.path(), Some((5, 7)), 3, 1.0, "train")?;
        let s = match a {
            Some(a) => s.augmented(a),
            None => s,
        };
        Ok(s.gather_epoch(&[0, 1, 2, 3], 9)?.0.to_vec2::<f32>()?)
    };
    assert_eq!(sized(Some(whole))?, sized(None)?);
    Ok(())
}

/// A `path` one level too high (`root/{train,val}/CLASS/IMAGE`) reads as two
/// classes, `train` and `val`, as `ImageFolder` reads it; `split_like` says
/// so. Class folders with images of their own, or with other subfolders,
/// are classes.
#[test]
fn split_folders_given_as_the_image_folder_are_told() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let px = |_: u32, _: u32| [1, 2, 3];
    for split in ["train", "val"] {
        for class in ["cat", "dog"] {
            png(&root.join(format!("{split}/{class}/0.png")), 2, 2, px);
        }
    }
    let src = taper::data::images(root, None, 3, 255.0, "all")?;
    assert_eq!(src.classes(), ["train", "val"]);
    let said = taper::data::split_like(root, src.classes()).expect("a warning");
    assert!(
        said.contains("class folders `train`, `val` each hold the same 2 folders (`cat`, `dog`) and no image of their own: they look like splits"),
        "{said}"
    );
    assert_eq!(
        taper::data::split_like(&root.join("train"), &["cat".into(), "dog".into()]),
        None
    );
    // An image of its own in a class folder: a class.
    png(&root.join("val/extra.png"), 2, 2, px);
    assert_eq!(taper::data::split_like(root, src.classes()), None);
    std::fs::remove_file(root.join("val/extra.png"))?;
    // Other subfolders: classes with their own structure.
    png(&root.join("val/bird/0.png"), 2, 2, px);
    assert_eq!(taper::data::split_like(root, src.classes()), None);
    Ok(())
}

/// Role words and a few others, for chats rendered by `CHAT_TEMPLATE`.
const CHAT_TOKENIZER: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
  "normalizer": null, "pre_tokenizer": { "type": "Whitespace" }, "post_processor": null,
  "decoder": null,
  "model": { "type": "WordLevel", "vocab": { "[UNK]": 0, "user": 1, "assistant": 2, "end": 3,
    "the": 4, "cat": 5, "sat": 6, "on": 7, "mat": 8, "system": 9 }, "unk_token": "[UNK]" }
}"#;

const CHAT_TEMPLATE: &str = "{% for m in messages %}{{ m.role }} {{ m.content }} end {% endfor %}{% if add_generation_prompt %}assistant {% endif %}";

fn chats(dir: &Path, lines: &str, context: usize) -> taper::Result<taper::data::Chats> {
    let tok = write(dir, "tokenizer.json", CHAT_TOKENIZER.as_bytes());
    let template = write(dir, "chat.jinja", CHAT_TEMPLATE.as_bytes());
    let path = write(dir, "chats.jsonl", lines.as_bytes());
    taper::data::chat(
        &path,
        taper::data::ChatOptions {
            tokenizer: &tok,
            template: &template,
            context,
            split: "train",
            train_on: taper::data::TrainOn::Assistant,
        },
    )
}

/// Sources of one chat file (a recipe's splits, or those a reloaded recipe
/// builds again) share one tokenization while any of them is alive; an
/// edited file, or another `context`, is tokenized afresh.
#[test]
fn chat_sources_of_the_same_bytes_share_one_tokenization() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let line = r#"{"messages": [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"}]}"#;
    let vocab = |c: &taper::data::Chats| c.vocab().expect("a vocabulary") as *const _;
    let a = chats(dir.path(), line, 16)?;
    let b = chats(dir.path(), line, 16)?;
    assert_eq!(vocab(&a), vocab(&b));
    let longer = chats(dir.path(), line, 32)?;
    assert_ne!(vocab(&a), vocab(&longer));
    let edited = chats(dir.path(), &format!("{line}\n{line}"), 16)?;
    assert_ne!(vocab(&a), vocab(&edited));
    assert_eq!((a.len(), edited.len()), (1, 2));
    Ok(())
}

/// `data:shuffle{ group_by_length = true }` draws batches of conversations
/// of like lengths, as transformers' `group_by_length`: every conversation
/// once an epoch, each run of 50 batches sorted longest first, a new order
/// every epoch, the same on a resume; the padding a batch computes (its
/// longest conversation times its size) falls to a fraction of a plain
/// shuffle's. Data of one length is refused.
#[test]
fn grouped_by_length_batches_pad_less_and_cover_every_conversation() -> Result<()> {
    use taper::data::{Pipeline, Source};
    let dir = tempfile::tempdir()?;
    let lines: String = (0..600)
        .map(|i| {
            let words = "the cat sat on the mat ".repeat(1 + (i * 7919) % 13);
            format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{words}\"}}, {{\"role\": \"assistant\", \"content\": \"sat\"}}]}}\n")
        })
        .collect();
    let src: Arc<dyn Source> = Arc::new(chats(dir.path(), &lines, 128)?);
    let lengths = src.lengths().expect("a chat file's lengths");
    let batch = 4;
    let grouped = Pipeline::new(src.clone())
        .shuffle_by_length(7)?
        .batch(batch, false);
    let plain = Pipeline::new(src.clone()).shuffle(7).batch(batch, false);
    // Positions a batch computes: its longest conversation, for each sample.
    let padded = |p: &Pipeline, epoch| -> Result<(usize, Vec<usize>)> {
        let (mut cost, mut order) = (0, Vec::new());
        for b in p.epoch(epoch, batch, 0) {
            let b = b?;
            cost += b.indices.iter().map(|&i| lengths[i]).max().unwrap() * b.indices.len();
            order.extend(b.indices);
        }
        Ok((cost, order))
    };
    let ((g1, order1), (g2, order2), (p1, _)) = (
        padded(&grouped, 1)?,
        padded(&grouped, 2)?,
        padded(&plain, 1)?,
    );
    let real: usize = lengths.iter().sum();
    eprintln!("positions computed: grouped {g1}, plain {p1}, the conversations' {real}");
    assert!(
        g1 < real + real / 10 && p1 > real + real / 2,
        "grouped {g1}, plain {p1}, real {real}"
    );
    let mut seen = order1.clone();
    seen.sort();
    assert_eq!(seen, (0..600).collect::<Vec<_>>());
    assert_ne!(order1, order2);
    assert!(g2 < real + real / 10);
    for group in order1.chunks(50 * batch) {
        assert!(group.windows(2).all(|w| lengths[w[0]] >= lengths[w[1]]));
    }
    // A resume 13 batches in draws the rest of the same order.
    let rest: Vec<usize> = grouped
        .epoch(1, batch, 13 * batch)
        .map(|b| b.map(|b| b.indices))
        .collect::<taper::Result<Vec<_>>>()?
        .concat();
    assert_eq!(rest, order1[13 * batch..]);
    let digits = Pipeline::new(Arc::new(taper::data::digits("train")?));
    let e = err_text(digits.shuffle_by_length(1));
    assert!(e.contains("all have one length"), "{e}");
    Ok(())
}

/// A conversation's replies are trained, its prompt and padding ignored;
/// one longer than `context` is cut and said to be, and one with no reply
/// within `context` is left out, and said to be.
#[test]
fn a_chat_file_trains_its_replies_and_says_what_it_cuts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let i = taper::engine::loss::IGNORE;
    let lines = r#"{"messages": [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat on the mat"}]}
{"prompt": [{"role": "system", "content": "the"}, {"role": "user", "content": "cat"}], "completion": [{"role": "assistant", "content": "sat"}]}
"#;
    let src = chats(dir.path(), lines, 12)?;
    assert_eq!(src.len(), 2);
    assert!(src.notes().is_empty(), "{:?}", src.notes());
    let (x, y) = src.gather(&[0, 1])?;
    let (x, y) = (x.to_vec2::<u32>()?, y.to_vec2::<u32>()?);
    let y_plain = y.clone();
    // user the cat end assistant | sat on the mat end
    assert_eq!(x[0], [1, 4, 5, 3, 2, 6, 7, 4, 8, 0, 0, 0]);
    assert_eq!(y[0], [i, i, i, i, 6, 7, 4, 8, 3, i, i, i]);
    // system the end user cat end assistant | sat end
    assert_eq!(x[1], [9, 4, 3, 1, 5, 3, 2, 6, 0, 0, 0, 0]);
    assert_eq!(y[1], [i, i, i, i, i, i, 6, 3, i, i, i, i]);
    let d = src.describe();
    assert!(
        d.contains("2 conversations, 19 tokens, 7 of them trained, context 12"),
        "{d}"
    );

    // Context 6: the first keeps 7 tokens, its reply's first two; the
    // second's reply starts at its 8th token and is left out.
    let cut = chats(dir.path(), lines, 6)?;
    assert_eq!(cut.len(), 1);
    let notes = cut.notes().join("\n");
    assert!(
        notes.contains("1 conversation(s) longer than context 6 + 1 tokens are cut there (line 1)"),
        "{notes}"
    );
    assert!(
        notes.contains(
            "1 conversation(s) have no reply token within context 6 and are left out (line 2)"
        ),
        "{notes}"
    );
    let (_, y) = cut.gather(&[0])?;
    assert_eq!(y.to_vec2::<u32>()?[0], [i, i, i, i, 6, 7]);

    // `train_on = "all"`: every token of the text, the padding still not.
    let every = taper::data::chat(
        &dir.path().join("chats.jsonl"),
        taper::data::ChatOptions {
            tokenizer: &dir.path().join("tokenizer.json"),
            template: &dir.path().join("chat.jinja"),
            context: 12,
            split: "train",
            train_on: taper::data::TrainOn::All,
        },
    )?;
    let (_, y) = every.gather(&[0])?;
    assert_eq!(y.to_vec2::<u32>()?[0], [4, 5, 3, 2, 6, 7, 4, 8, 3, i, i, i]);

    // As Windows' Notepad saves it: a byte order mark, CRLF line ends.
    let windows = format!("\u{feff}{}", lines.replace('\n', "\r\n"));
    let (wx, wy) = chats(dir.path(), &windows, 12)?.gather(&[0, 1])?;
    assert_eq!((wx.to_vec2::<u32>()?, wy.to_vec2::<u32>()?), (x, y_plain));
    Ok(())
}

#[test]
fn chat_file_errors_name_the_line_and_the_format_to_give() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ok = r#"{"messages": [{"role": "user", "content": "the"}, {"role": "assistant", "content": "cat"}]}"#;
    let cases = [
        ("not json", "chats.jsonl:2: not a JSON object"),
        (
            r#"{"conversations": [{"from": "human", "value": "the"}]}"#,
            "chats.jsonl:2: `conversations` (ShareGPT's format, `from` and `value`): rename it `messages`",
        ),
        (
            r#"{"prompt": "the", "completion": "cat"}"#,
            "chats.jsonl:2: `prompt` is text: give it as messages",
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "the"}]}]}"#,
            "chats.jsonl:2: messages[0]: its `content` is not text",
        ),
        (r#"{"text": "the cat"}"#, "chats.jsonl:2: no `messages` (or `prompt` and `completion`) in it; its keys are [\"text\"]"),
    ];
    for (line, says) in cases {
        let e = err_text(chats(dir.path(), &format!("{ok}\n{line}\n"), 16));
        assert!(e.contains(says), "{line}: {e}");
    }
    let e = err_text(chats(
        dir.path(),
        r#"{"messages": [{"role": "user", "content": "the"}]}"#,
        16,
    ));
    assert!(
        e.contains("chats.jsonl: no conversation with a reply to train on"),
        "{e}"
    );

    // A template that renders earlier turns otherwise once the
    // conversation goes on cannot tell a reply's tokens.
    let tok = write(dir.path(), "tokenizer.json", CHAT_TOKENIZER.as_bytes());
    let rewrites = write(
        dir.path(),
        "rewrites.jinja",
        b"{% for m in messages %}{% if loop.last %}{{ m.role }} {% endif %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant {% endif %}",
    );
    let path = write(dir.path(), "two.jsonl", ok.as_bytes());
    let opts = |template| taper::data::ChatOptions {
        tokenizer: &tok,
        template,
        context: 16,
        split: "train",
        train_on: taper::data::TrainOn::Assistant,
    };
    let e = err_text(taper::data::chat(&path, opts(&rewrites)));
    assert!(e.contains("two.jsonl:1: the chat template renders the conversation before message 1 differently once it goes on") && e.contains("train_on = \"all\""), "{e}");
    let config = write(
        dir.path(),
        "tokenizer_config.json",
        b"{\"bos_token\": \"<s>\"}",
    );
    let e = err_text(taper::data::chat(&path, opts(&config)));
    assert!(
        e.contains("tokenizer_config.json: no `chat_template` in it"),
        "{e}"
    );
    Ok(())
}

/// The lines of `places` (rows left out, texts cut).
fn lines(places: &[taper::data::Place]) -> Vec<usize> {
    places.iter().map(|p| p.line()).collect()
}
