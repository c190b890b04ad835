"""ComfyUI prompts in API format (what the frontend POSTs to /prompt), shaped like ComfyUI's
own templates, for tests/python/test_comfyui_node.py. Pure data: no imports."""


def _clip_text(clip, text="a photo"):
    return {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": clip}}


# ComfyUI's default graph: SD1.5 checkpoint, KSampler, VAEDecode, SaveImage.
SD15 = {
    "3": {"class_type": "KSampler", "inputs": {
        "seed": 156680208700286, "steps": 20, "cfg": 8.0, "sampler_name": "euler",
        "scheduler": "normal", "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0],
        "negative": ["7", 0], "latent_image": ["5", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple",
          "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
    "6": _clip_text(["4", 1], "beautiful scenery nature glass bottle landscape"),
    "7": _clip_text(["4", 1], "text, watermark"),
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
}

# Wan 2.2 text-to-video, two experts: the high-noise model samples the first steps, its latent
# goes to the low-noise model's KSamplerAdvanced.
WAN22 = {
    "37": {"class_type": "UNETLoader", "inputs": {
        "unet_name": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
    "56": {"class_type": "UNETLoader", "inputs": {
        "unet_name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
    "38": {"class_type": "CLIPLoader", "inputs": {
        "clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
    "39": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
    "54": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8.0, "model": ["37", 0]}},
    "55": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8.0, "model": ["56", 0]}},
    "6": _clip_text(["38", 0], "a fox running through snow"),
    "7": _clip_text(["38", 0], "blurry"),
    "59": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {
        "width": 640, "height": 640, "length": 81, "batch_size": 1}},
    "57": {"class_type": "KSamplerAdvanced", "inputs": {
        "add_noise": "enable", "noise_seed": 1, "steps": 20, "cfg": 3.5, "sampler_name": "euler",
        "scheduler": "simple", "start_at_step": 0, "end_at_step": 10,
        "return_with_leftover_noise": "enable", "model": ["54", 0], "positive": ["6", 0],
        "negative": ["7", 0], "latent_image": ["59", 0]}},
    "58": {"class_type": "KSamplerAdvanced", "inputs": {
        "add_noise": "disable", "noise_seed": 0, "steps": 20, "cfg": 3.5, "sampler_name": "euler",
        "scheduler": "simple", "start_at_step": 10, "end_at_step": 10000,
        "return_with_leftover_noise": "disable", "model": ["55", 0], "positive": ["6", 0],
        "negative": ["7", 0], "latent_image": ["57", 0]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["58", 0], "vae": ["39", 0]}},
    "60": {"class_type": "CreateVideo", "inputs": {"fps": 16.0, "images": ["8", 0]}},
    "61": {"class_type": "SaveVideo", "inputs": {
        "filename_prefix": "video/ComfyUI", "format": "auto", "codec": "auto", "video": ["60", 0]}},
}

# Flux dev: UNETLoader, DualCLIPLoader (T5 + CLIP-L), VAELoader, SamplerCustomAdvanced.
FLUX = {
    "6": _clip_text(["11", 0], "a cat holding a sign"),
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["13", 0], "vae": ["10", 0]}},
    "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    "10": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
    "11": {"class_type": "DualCLIPLoader", "inputs": {
        "clip_name1": "t5xxl_fp16.safetensors", "clip_name2": "clip_l.safetensors",
        "type": "flux", "device": "default"}},
    "12": {"class_type": "UNETLoader", "inputs": {
        "unet_name": "flux1-dev.safetensors", "weight_dtype": "default"}},
    "13": {"class_type": "SamplerCustomAdvanced", "inputs": {
        "noise": ["25", 0], "guider": ["22", 0], "sampler": ["16", 0], "sigmas": ["17", 0],
        "latent_image": ["27", 0]}},
    "16": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
    "17": {"class_type": "BasicScheduler", "inputs": {
        "scheduler": "simple", "steps": 20, "denoise": 1.0, "model": ["12", 0]}},
    "22": {"class_type": "BasicGuider", "inputs": {"model": ["12", 0], "conditioning": ["26", 0]}},
    "25": {"class_type": "RandomNoise", "inputs": {"noise_seed": 42}},
    "26": {"class_type": "FluxGuidance", "inputs": {"guidance": 3.5, "conditioning": ["6", 0]}},
    "27": {"class_type": "EmptySD3LatentImage", "inputs": {
        "width": 1024, "height": 1024, "batch_size": 1}},
}

# SDXL checkpoint with two LoRAs chained, a ControlNet, an upscale model, and two outputs
# (a preview of the base image and the saved upscale).
SDXL_LORAS = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd_xl_base_1.0.safetensors"}},
    "10": {"class_type": "LoraLoader", "inputs": {
        "lora_name": "style/watercolor.safetensors", "strength_model": 0.8, "strength_clip": 0.8,
        "model": ["4", 0], "clip": ["4", 1]}},
    "11": {"class_type": "LoraLoader", "inputs": {
        "lora_name": "detail.safetensors", "strength_model": 0.5, "strength_clip": 0.5,
        "model": ["10", 0], "clip": ["10", 1]}},
    "6": _clip_text(["11", 1], "a castle"),
    "7": _clip_text(["11", 1], "lowres"),
    "12": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "sdxl_canny.safetensors"}},
    "13": {"class_type": "LoadImage", "inputs": {"image": "edges.png"}},
    "14": {"class_type": "ControlNetApplyAdvanced", "inputs": {
        "strength": 0.7, "start_percent": 0.0, "end_percent": 1.0, "positive": ["6", 0],
        "negative": ["7", 0], "control_net": ["12", 0], "image": ["13", 0]}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
    "3": {"class_type": "KSampler", "inputs": {
        "seed": 5, "steps": 25, "cfg": 7.0, "sampler_name": "dpmpp_2m", "scheduler": "karras",
        "denoise": 1.0, "model": ["11", 0], "positive": ["14", 0], "negative": ["14", 1],
        "latent_image": ["5", 0]}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "20": {"class_type": "PreviewImage", "inputs": {"images": ["8", 0]}},
    "21": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": "4x-UltraSharp.safetensors"}},
    "22": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["21", 0], "image": ["8", 0]}},
    "23": {"class_type": "SaveImage", "inputs": {"filename_prefix": "up", "images": ["22", 0]}},
}

WORKFLOWS = {"sd15": SD15, "wan22": WAN22, "flux": FLUX, "sdxl_loras": SDXL_LORAS}
